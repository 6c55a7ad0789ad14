package redisconn

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/redistest"
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
}

// TestUnixURL: a unix:// URL names a socket, with its DB and credentials;
// Options override the URL's; a Cluster over a socket is refused.
func TestUnixURL(t *testing.T) {
	o, err := ClientOptions(Options{URL: "unix://u:pw@/run/redis.sock?db=3", PoolSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Addrs) != 1 || o.Addrs[0] != "/run/redis.sock" || o.DB != 3 || o.Username != "u" || o.Password != "pw" ||
		o.PoolSize != 4 || o.IsClusterMode || o.Dialer == nil {
		t.Errorf("unix URL: %+v", o)
	}
	o, err = ClientOptions(Options{URL: "unix:///run/redis.sock", Username: "v", Password: "other"})
	if err != nil || o.Username != "v" || o.Password != "other" {
		t.Errorf("credentials over a unix URL's: %+v %v", o, err)
	}
	if _, err := ClientOptions(Options{URL: "unix:///run/redis.sock", Cluster: true}); !errors.Is(err, ErrBadURL) {
		t.Errorf("a Cluster over a unix socket: %v, want ErrBadURL", err)
	}
	if _, err := ParseURL("unix://u:s3cret@/run/x.sock?nope=1"); !errors.Is(err, ErrBadURL) || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("bad unix URL: %v; want ErrBadURL without the password", err)
	}
}

// TestRetries: commands are not retried unless asked, by Options or by
// the URL's max_retries; a dial is tried once.
func TestRetries(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want int
	}{
		{Options{URL: "redis://h:1"}, -1},
		{Options{URL: "redis-cluster://h:1"}, -1},
		{Options{URL: "redis://h:1?max_retries=2"}, 2},
		{Options{URL: "redis://h:1?max_retries=2", MaxRetries: 5}, 5},
	} {
		o, err := ClientOptions(tc.o)
		if err != nil {
			t.Fatal(err)
		}
		if o.MaxRetries != tc.want || o.DialerRetries != 1 {
			t.Errorf("%+v: MaxRetries %d, DialerRetries %d; want %d, 1", tc.o, o.MaxRetries, o.DialerRetries, tc.want)
		}
	}
}

// TestClusterNoBackoff: a Cluster client's attempts at a node it cannot
// reach (go-redis sends a command again up to MaxRedirects times) are made
// without a backoff between them; other clients keep go-redis' settings,
// and a redis:// URL's own.
func TestClusterNoBackoff(t *testing.T) {
	for _, tc := range []struct {
		o        Options
		min, max time.Duration
	}{
		{Options{URL: "redis-cluster://h:1"}, -1, -1},
		{Options{URL: "redis://h:1", Cluster: true}, -1, -1},
		{Options{ClusterAddrs: []string{"h:1", "h:2"}}, -1, -1},
		{Options{URL: "redis://h:1"}, 0, 0},
		{Options{URL: "redis-sentinel://h:1,h:2/m"}, 0, 0},
		{Options{URL: "redis://h:1?min_retry_backoff=3ms&max_retry_backoff=40ms"}, 3 * time.Millisecond, 40 * time.Millisecond},
	} {
		o, err := ClientOptions(tc.o)
		if err != nil {
			t.Fatal(err)
		}
		if o.MinRetryBackoff != tc.min || o.MaxRetryBackoff != tc.max {
			t.Errorf("%+v: backoff %v..%v, want %v..%v", tc.o, o.MinRetryBackoff, o.MaxRetryBackoff, tc.min, tc.max)
		}
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

// TestRefusedAtOnce: a dial that nothing answers fails with ErrRefused
// after one attempt, with no go-redis retry.
func TestRefusedAtOnce(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there now
	c, err := Open(Options{URL: "redis://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := &redistest.Hook{}
	c.AddHook(h)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = c.Ping(ctx).Err()
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("ping of a closed port: %v, want ErrRefused", err)
	}
	if ctx.Err() != nil {
		t.Error("the ping waited for its deadline")
	}
	if dials, failed := h.Dials(); dials != 1 || failed != 1 {
		t.Errorf("%d dials (%d failed), want one that failed", dials, failed)
	}
}
