package lyftenv_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/lyftenv"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestRead(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []lyftenv.Flag
	}{
		{"nothing", nil, nil},
		{"runtime root", map[string]string{"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit"},
			[]lyftenv.Flag{{"config", "/data/ratelimit/config", "RUNTIME_ROOT"}}},
		{"ports", map[string]string{"GRPC_PORT": "9000", "DEBUG_PORT": "7000"},
			[]lyftenv.Flag{{"grpc-addr", ":9000", "GRPC_PORT"}, {"debug-addr", "127.0.0.1:7000", "DEBUG_PORT"}}},
		{"sentinel over TLS", map[string]string{"REDIS_URL": "mymaster,h1:26379,h2:26379", "REDIS_TYPE": "SENTINEL", "REDIS_TLS": "true"},
			[]lyftenv.Flag{{"redis-url", "rediss-sentinel://h1:26379,h2:26379/mymaster", "REDIS_URL"}, {"store", "redis", "REDIS_URL"}}},
		{"cluster", map[string]string{"REDIS_URL": "a:1,b:2", "REDIS_TYPE": "cluster", "REDIS_POOL_SIZE": "7"},
			[]lyftenv.Flag{{"redis-pool-size", "7", "REDIS_POOL_SIZE"}, {"redis-url", "redis-cluster://a:1,b:2", "REDIS_URL"}, {"store", "redis", "REDIS_URL"}}},
	} {
		s, err := lyftenv.Read(envOf(tc.env))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if d := cmp.Diff(tc.want, s.Flags); d != "" {
			t.Errorf("%s: flags (-want +got):\n%s", tc.name, d)
		}
	}
	s, err := lyftenv.Read(envOf(map[string]string{"REDIS_AUTH": "u:p", "LOG_LEVEL": "debug"}))
	if err != nil || s.RedisUsername != "u" || s.RedisPassword != "p" || s.LogLevel != "debug" || len(s.Flags) != 0 {
		t.Errorf("REDIS_AUTH, LOG_LEVEL: %+v %v", s, err)
	}
	for env, name := range map[string]string{"PORT": "PORT", "BACKEND_TYPE": "BACKEND_TYPE", "REDIS_TYPE": "REDIS_TYPE", "REDIS_TLS": "REDIS_TLS"} {
		m := map[string]string{env: "bogus", "REDIS_URL": "h:1"}
		if _, err := lyftenv.Read(envOf(m)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=bogus: %v, want an error naming %s", env, err, name)
		}
	}
}
