package redisstore

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url     string
		addrs   []string
		master  string
		cluster bool
		tls     bool
		user    string
		pass    string
		db      int
	}{
		{url: "redis://localhost:6379/2", addrs: []string{"localhost:6379"}, db: 2},
		{url: "rediss://u:p%40ss@h:6380/0", addrs: []string{"h:6380"}, tls: true, user: "u", pass: "p@ss"},
		{url: "redis-sentinel://u:pw@s1:26379,s2:26379/mymaster/3?sentinel_password=x", addrs: []string{"s1:26379", "s2:26379"}, master: "mymaster", user: "u", pass: "pw", db: 3},
		{url: "redis-cluster://n1:7000,n2:7001,n3", addrs: []string{"n1:7000", "n2:7001", "n3:6379"}, cluster: true},
		{url: "rediss-cluster://:secret@n1:7000", addrs: []string{"n1:7000"}, cluster: true, tls: true, pass: "secret"},
	} {
		u, err := ParseURL(tc.url)
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		if len(u.Addrs) != len(tc.addrs) || u.MasterName != tc.master || u.IsClusterMode != tc.cluster ||
			(u.TLSConfig != nil) != tc.tls || u.Username != tc.user || u.Password != tc.pass || u.DB != tc.db {
			t.Errorf("%s: got %+v", tc.url, u)
			continue
		}
		for i := range tc.addrs {
			if u.Addrs[i] != tc.addrs[i] {
				t.Errorf("%s: addrs %v, want %v", tc.url, u.Addrs, tc.addrs)
			}
		}
	}
	for _, bad := range []string{"", "localhost:6379", "http://x", "redis-sentinel://h:1", "redis-cluster://h:1/0", "redis-cluster://", "redis-sentinel://h:1/m?nope=1", "redis-sentinel://h:1/m/x"} {
		if _, err := ParseURL(bad); !errors.Is(err, ErrBadURL) {
			t.Errorf("%q: err %v, want ErrBadURL", bad, err)
		}
	}
	// go-redis' other parameters of a redis:// URL are kept, not dropped.
	u, err := ParseURL("redis://h:6379/0?pool_timeout=7s&min_idle_conns=5&max_idle_conns=6&max_active_conns=9&conn_max_idle_time=2m&conn_max_lifetime=1m&pool_fifo=true&min_retry_backoff=3ms&max_retry_backoff=40ms")
	if err != nil {
		t.Fatal(err)
	}
	if u.PoolTimeout != 7*time.Second || u.MinIdleConns != 5 || u.MaxIdleConns != 6 || u.MaxActiveConns != 9 ||
		u.ConnMaxIdleTime != 2*time.Minute || u.ConnMaxLifetime != time.Minute || !u.PoolFIFO ||
		u.MinRetryBackoff != 3*time.Millisecond || u.MaxRetryBackoff != 40*time.Millisecond {
		t.Errorf("redis:// query parameters dropped: %+v", u)
	}
	o, err := ClientOptions(Options{URL: "redis://h:1", PoolSize: 7, ReadTimeout: time.Millisecond})
	if err != nil || o.PoolSize != 7 || o.ReadTimeout != time.Millisecond || !o.ContextTimeoutEnabled {
		t.Errorf("ClientOptions: %+v, %v", o, err)
	}
	if _, err := New(Options{URL: "redis://h:1", KeyPrefix: "a{b"}); err == nil {
		t.Error("a key prefix with a brace was accepted")
	}
}

// TestParseURLHidesPassword: no error of a bad URL shows its password,
// whatever part of the URL is at fault.
func TestParseURLHidesPassword(t *testing.T) {
	for _, raw := range []string{
		"user:s3cret@host:6379",
		"redis://user:s3cret@host:notaport",
		"redis://user:s3cret@host:6379/notadb",
		"redis://user:s3%2Fcret@host:6379/x",
		"http://user:s3cret@host",
		"redis-sentinel://user:s3cret@h:1",
		"redis-sentinel://h:1/m?sentinel_password=s3cret&nope=1",
		"redis-cluster://user:s3cret@h:1/0",
		"rediss://:s3cret@[::1",
		`redis-sentinel://u:s3cr"et@h:26379/`,
		`redis-cluster://u:s3cr\et@h:7000/?bogus=1`,
		`redis://u:s3cr"et@h:notaport/0`,
	} {
		_, err := ParseURL(raw)
		if err == nil {
			t.Errorf("%q: accepted", raw)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, "s3cr") || strings.Contains(msg, "s3/cret") || strings.Contains(msg, "s3%2Fcret") {
			t.Errorf("%q: error shows the password: %s", raw, msg)
		}
	}
}
