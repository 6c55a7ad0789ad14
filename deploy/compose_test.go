package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	yamlv3 "gopkg.in/yaml.v3"

	"github.com/charonlimit/charon/config"
)

// composeFile is the part of the Compose specification the example uses;
// decoding refuses any other field.
type composeFile struct {
	Name     string `yaml:"name"`
	Services map[string]struct {
		Image string `yaml:"image"`
		Build *struct {
			Context    string `yaml:"context"`
			Dockerfile string `yaml:"dockerfile"`
		} `yaml:"build"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		Ports       []string          `yaml:"ports"`
		DependsOn   []string          `yaml:"depends_on"`
	} `yaml:"services"`
}

// TestCompose: the example's services are Envoy, two Charon replicas
// sharing Redis and an upstream; Charon is built from the repository's
// Dockerfile with flags `charon serve` knows and a configuration that loads;
// the Envoy bootstrap validates and asks both replicas.
func TestCompose(t *testing.T) {
	dec := yamlv3.NewDecoder(bytes.NewReader(readFile(t, "compose/docker-compose.yaml")))
	dec.KnownFields(true)
	var cf composeFile
	if err := dec.Decode(&cf); err != nil {
		t.Fatal(err)
	}
	known := charonServeFlags(t)
	replicas := 0
	for name, s := range cf.Services {
		for _, d := range s.DependsOn {
			if _, ok := cf.Services[d]; !ok {
				t.Errorf("%s depends on unknown service %s", name, d)
			}
		}
		for _, v := range s.Volumes {
			host, _, _ := strings.Cut(v, ":")
			if _, err := os.Stat(filepath.Join("compose", host)); err != nil {
				t.Errorf("%s: volume %s: %v", name, v, err)
			}
		}
		if !strings.HasPrefix(name, "charon-") {
			continue
		}
		replicas++
		if s.Build == nil || filepath.Clean(filepath.Join("compose", s.Build.Context, s.Build.Dockerfile)) != filepath.Clean("../Dockerfile") {
			t.Errorf("%s: not built from the repository's Dockerfile", name)
		}
		if len(s.Command) == 0 || s.Command[0] != "serve" {
			t.Fatalf("%s: command %v, want serve", name, s.Command)
		}
		for i, a := range s.Command {
			if f, ok := strings.CutPrefix(a, "--"); ok && !slices.Contains(known, f) {
				t.Errorf("%s: charon serve has no flag --%s", name, f)
			}
			if a == "--redis-url" && (i+1 >= len(s.Command) || !strings.Contains(s.Command[i+1], "//redis:")) {
				t.Errorf("%s: --redis-url does not name the redis service", name)
			}
		}
		for _, v := range s.Volumes {
			host, target, _ := strings.Cut(v, ":")
			if strings.HasPrefix(target, "/etc/charon/config") {
				if _, _, err := config.Load(os.DirFS(filepath.Join("compose", host)), config.Options{}); err != nil {
					t.Errorf("%s: the mounted configuration does not load: %v", name, err)
				}
			}
		}
	}
	if replicas != 2 {
		t.Errorf("%d Charon replicas, want 2", replicas)
	}
	for _, need := range []string{"redis", "envoy", "upstream"} {
		if _, ok := cf.Services[need]; !ok {
			t.Errorf("no service %s", need)
		}
	}

	var b bootstrapv3.Bootstrap
	decode(t, "compose/envoy.yaml", readYAML(t, "compose/envoy.yaml"), &b)
	if n := validateDeep(t, "compose/envoy.yaml", &b); n < 5 {
		t.Errorf("validated %d messages, want at least 5", n)
	}
	checkRemoteAddress(t, "compose/envoy.yaml", &b)
	var hosts []string
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() != "charon" {
			continue
		}
		for _, e := range c.GetLoadAssignment().GetEndpoints() {
			for _, le := range e.GetLbEndpoints() {
				sa := le.GetEndpoint().GetAddress().GetSocketAddress()
				hosts = append(hosts, sa.GetAddress())
				if sa.GetPortValue() != 8081 {
					t.Errorf("charon endpoint %s port %d, want 8081", sa.GetAddress(), sa.GetPortValue())
				}
			}
		}
	}
	slices.Sort(hosts)
	if !slices.Equal(hosts, []string{"charon-1", "charon-2"}) {
		t.Errorf("Envoy's charon cluster asks %v, want both replicas", hosts)
	}
}
