package deploy

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/dockerignore"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/charonlimit/charon/internal/lyftenv"
)

func parseDockerfile(t *testing.T) []instructions.Stage {
	t.Helper()
	res, err := parser.Parse(bytes.NewReader(readFile(t, "../Dockerfile")))
	if err != nil {
		t.Fatal(err)
	}
	stages, _, err := instructions.Parse(res.AST, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a build stage and a runtime stage", len(stages))
	}
	return stages
}

// TestDockerfile checks the image's properties from the Dockerfile as
// Docker's own parser reads it: multi-stage, the Go of go.mod, a static
// binary on distroless, a non-root user, no shell needed to start or
// probe it, the ports and a health check declared, the version stamped.
func TestDockerfile(t *testing.T) {
	stages := parseDockerfile(t)
	build, final := stages[0], stages[len(stages)-1]
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(readFile(t, "../go.mod"))
	if goVersion == nil || build.BaseName != "golang:"+string(goVersion[1]) {
		t.Errorf("build stage FROM %s, want golang:%s (go.mod's)", build.BaseName, goVersion[1])
	}
	if !strings.HasPrefix(final.BaseName, "gcr.io/distroless/static") && final.BaseName != "scratch" {
		t.Errorf("runtime stage FROM %s, want a distroless static base or scratch", final.BaseName)
	}
	var (
		user, entry string
		ports       []string
		health      []string
		copied      bool
		versionOK   bool
		ratelimit   bool
	)
	for _, c := range build.Commands {
		if r, ok := c.(*instructions.RunCommand); ok && strings.Contains(strings.Join(r.CmdLine, " "), "go build") {
			line := strings.Join(r.CmdLine, " ")
			versionOK = strings.Contains(line, "-X main.version=${VERSION}") && strings.Contains(line, "-trimpath")
		}
	}
	for _, c := range final.Commands {
		switch c := c.(type) {
		case *instructions.UserCommand:
			user = c.User
		case *instructions.ExposeCommand:
			ports = append(ports, c.Ports...)
		case *instructions.HealthCheckCommand:
			health = c.Health.Test
		case *instructions.EntrypointCommand:
			if c.PrependShell {
				t.Error("ENTRYPOINT in shell form: the image has no shell")
			}
			entry = c.CmdLine[0]
		case *instructions.CmdCommand:
			if c.PrependShell {
				t.Error("CMD in shell form: the image has no shell")
			}
		case *instructions.RunCommand:
			t.Errorf("RUN in the runtime stage: %v (the image has no shell)", c.CmdLine)
		case *instructions.CopyCommand:
			if c.From == build.Name && slices.Contains(c.SourcePaths, "/out/charon") {
				copied = c.DestPath == entry || c.DestPath == "/usr/local/bin/charon"
			}
			if c.From == build.Name && (c.DestPath == lyftCommand || path.Clean(c.DestPath) == path.Dir(lyftCommand)) {
				ratelimit = true
			}
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				if strings.HasPrefix(kv.Key, "CHARON_") || slices.Contains(lyftenv.Names(), kv.Key) {
					t.Errorf("ENV %s=%s in the image: a CHARON_ variable outranks envoyproxy/ratelimit's, and either "+
						"stands in for one a Deployment leaves unset, so a migrated Deployment would not run as its "+
						"environment says; compile defaults in instead (-X main.defaultConfigDir)", kv.Key, kv.Value)
				}
			}
		}
	}
	if !ratelimit {
		t.Errorf("no COPY --from=%s puts %s in the image: envoyproxy/ratelimit's deployments run it", build.Name, lyftCommand)
	}
	if user == "" || user == "root" || strings.HasPrefix(user, "0:") || user == "0" {
		t.Errorf("USER %q, want a non-root user", user)
	}
	for _, p := range []string{"8081", "8080", "6070"} {
		if !slices.Contains(ports, p) {
			t.Errorf("EXPOSE %v lacks %s", ports, p)
		}
	}
	if len(health) < 3 || health[0] != "CMD" || health[1] != entry || health[2] != "health" {
		t.Errorf("HEALTHCHECK %v, want the exec form [CMD %s health ...]", health, entry)
	}
	if !copied || entry != "/usr/local/bin/charon" {
		t.Errorf("the binary built in %s is not what ENTRYPOINT %s runs", build.Name, entry)
	}
	if !versionOK {
		t.Error("the build stage's go build does not stamp -X main.version=${VERSION} with -trimpath")
	}
}

// TestDockerfileBuild builds the binary exactly as the Dockerfile's build
// stage does: from a context filtered by .dockerignore, its COPY, ARG, ENV
// and RUN in order (with /src and /out in a temporary directory), and checks
// that the binary is static and carries the version given.
func TestDockerfileBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	stages := parseDockerfile(t)
	tmp := t.TempDir()
	context := filepath.Join(tmp, "context")
	copyContext(t, "..", context)
	root := func(p string) string { return filepath.Join(tmp, "root", p) }
	env := os.Environ()
	args := map[string]string{"VERSION": "v9.9.9-test"}
	workdir := root("/")
	for _, c := range stages[0].Commands {
		switch c := c.(type) {
		case *instructions.WorkdirCommand:
			workdir = root(c.Path)
			if err := os.MkdirAll(workdir, 0o755); err != nil {
				t.Fatal(err)
			}
		case *instructions.CopyCommand:
			for _, src := range c.SourcePaths {
				dst := filepath.Join(workdir, c.DestPath)
				if !strings.HasSuffix(c.DestPath, "/") && c.DestPath != "." {
					t.Fatalf("COPY to %s: the test knows directory destinations only", c.DestPath)
				}
				if src == "." {
					copyTree(t, context, dst)
				} else {
					copyTree(t, filepath.Join(context, src), filepath.Join(dst, filepath.Base(src)))
				}
			}
		case *instructions.ArgCommand:
			for _, a := range c.Args {
				v, given := args[a.Key]
				if !given && a.Value != nil {
					v = *a.Value
				}
				env = append(env, a.Key+"="+v)
			}
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				env = append(env, kv.Key+"="+kv.Value)
			}
		case *instructions.RunCommand:
			line := strings.ReplaceAll(strings.Join(c.CmdLine, " "), "/out/", root("/out")+"/")
			cmd := exec.Command("sh", "-c", line)
			cmd.Dir, cmd.Env = workdir, env
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("RUN %s: %v\n%s", line, err, out)
			}
		default:
			t.Fatalf("build stage: the test does not know %T", c)
		}
	}
	// The runtime stage's other COPYs take files the context has.
	for _, c := range stages[len(stages)-1].Commands {
		if c, ok := c.(*instructions.CopyCommand); ok && c.From == "" {
			for _, src := range c.SourcePaths {
				if _, err := os.Stat(filepath.Join(context, src)); err != nil {
					t.Errorf("runtime stage COPY %s: not in the build context: %v", src, err)
				}
			}
		}
	}
	bin := root("/out/charon")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	libs, _ := f.ImportedLibraries()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has a dynamic loader: not static")
		}
	}
	if len(libs) > 0 {
		t.Errorf("the binary needs %v: not static", libs)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || strings.TrimSpace(string(out)) != "charon v9.9.9-test" {
		t.Errorf("charon version: %q, %v; want the version given to the build", out, err)
	}
	checkImageCommands(t, stages, root, bin)
}

// lyftCommand is envoyproxy/ratelimit's binary, the command its
// deployments run (its image has no entrypoint).
const lyftCommand = "/bin/ratelimit"

// checkImageCommands checks, on the binary bin built by the build stage
// into root, what a Deployment migrated from envoyproxy/ratelimit gets:
// the image's /bin/ratelimit is the binary, which serves when run under
// that name, and its environment (here Istio's samples/ratelimit:
// RUNTIME_ROOT and RUNTIME_SUBDIRECTORY) says the configuration directory
// over the image's default, the examples the runtime stage copies.
func checkImageCommands(t *testing.T, stages []instructions.Stage, root func(string) string, bin string) {
	t.Helper()
	build, final := stages[0], stages[len(stages)-1]
	var entry, examples string
	var imageEnv []string
	for _, c := range final.Commands {
		switch c := c.(type) {
		case *instructions.EntrypointCommand:
			entry = c.CmdLine[0]
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				imageEnv = append(imageEnv, kv.Key+"="+kv.Value)
			}
		case *instructions.CopyCommand:
			if c.From == "" && slices.Contains(c.SourcePaths, "examples/config") {
				examples = path.Clean(c.DestPath)
			}
		}
	}
	// What the image holds at p, as a path under root, through the runtime
	// stage's COPY --from=build (the last one wins).
	inImage := func(p string) string {
		found := ""
		for _, c := range final.Commands {
			c, ok := c.(*instructions.CopyCommand)
			if !ok || c.From != build.Name {
				continue
			}
			for _, src := range c.SourcePaths {
				fi, err := os.Stat(root(src))
				switch {
				case err != nil:
					t.Errorf("COPY --from=%s %s: %v", build.Name, src, err)
				case fi.IsDir():
					if rel, ok := strings.CutPrefix(p, strings.TrimSuffix(c.DestPath, "/")+"/"); ok {
						if _, err := os.Lstat(root(path.Join(src, rel))); err == nil {
							found = root(path.Join(src, rel))
						}
					}
				case strings.HasSuffix(c.DestPath, "/") && path.Join(c.DestPath, path.Base(src)) == p, c.DestPath == p:
					found = root(src)
				}
			}
		}
		return found
	}
	ratelimit := inImage(lyftCommand)
	if fi, err := os.Lstat(ratelimit); ratelimit == "" || err != nil {
		t.Errorf("the image has no %s", lyftCommand)
	} else if fi.Mode()&fs.ModeSymlink != 0 {
		if target, _ := os.Readlink(ratelimit); target != entry || inImage(entry) != bin {
			t.Errorf("the image's %s links to %s, want the binary %s", lyftCommand, target, entry)
		}
	} else if ratelimit != bin {
		t.Errorf("the image's %s is %s of the build stage, want the binary", lyftCommand, ratelimit)
	}

	out, _ := exec.Command(bin, "serve", "-h").CombinedOutput()
	if examples == "" || !strings.Contains(string(out), fmt.Sprintf("(default %q)", examples)) {
		t.Errorf("charon serve -h does not give --config the default %q (the examples' place in the image):\n%s", examples, out)
	}

	// Run as envoyproxy/ratelimit's deployments run it, with no argument:
	// serve loads the RUNTIME_* directory (missing here, so it stops at
	// once, naming it), not the image's.
	link := filepath.Join(t.TempDir(), "bin", "ratelimit")
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bin, link); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, link)
	cmd.Env = append(imageEnv, "RUNTIME_ROOT="+data, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"RUNTIME_IGNOREDOTFILES=true", "LOG_LEVEL=debug", "USE_STATSD=false")
	out, err := cmd.CombinedOutput()
	want := filepath.Join(data, "ratelimit", "config")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "cannot start") || !strings.Contains(string(out), want) {
		t.Errorf("%s with RUNTIME_ROOT and RUNTIME_SUBDIRECTORY: %v\n%s\nwant serve stopping on %s, the Deployment's directory", lyftCommand, err, out, want)
	}
}

// copyContext copies the repository at src to dst without what
// .dockerignore excludes, as Docker sends a build context.
func copyContext(t *testing.T, src, dst string) {
	t.Helper()
	f, err := os.Open(filepath.Join(src, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := dockerignore.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if rel == "." {
			return nil
		}
		if skip, _ := pm.MatchesOrParentMatches(rel); skip {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		return copyEntry(p, filepath.Join(dst, rel), d)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// copyTree copies the file or directory src to dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		return copyEntry(p, filepath.Join(dst, rel), d)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func copyEntry(src, dst string, d fs.DirEntry) error {
	if d.IsDir() {
		return os.MkdirAll(dst, 0o755)
	}
	if !d.Type().IsRegular() {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// TestImageTheInstallsRun: the image the chart and deploy/kubernetes run by
// default is one `make image` builds, pulled only when missing, so that a
// loaded image (kind load docker-image) is what starts.
func TestImageTheInstallsRun(t *testing.T) {
	out, err := exec.Command("make", "-C", "..", "-n", "image").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n image: %v\n%s", err, out)
	}
	tags := regexp.MustCompile(`-t (\S+)`).FindAllStringSubmatch(string(out), -1)
	built := map[string]bool{}
	for _, m := range tags {
		built[m[1]] = true
	}
	c := loadChart(t)
	objs, err := render(t, c, "")
	if err != nil {
		t.Fatal(err)
	}
	d, _ := find[*appsv1.Deployment](objs, "Deployment", "charon")
	for _, variant := range []string{"memory.yaml", "redis.yaml"} {
		m, _ := find[*appsv1.Deployment](decodeObjects(t, variant, readFile(t, "kubernetes/"+variant)), "Deployment", "charon")
		d.Spec.Template.Spec.Containers = append(d.Spec.Template.Spec.Containers, m.Spec.Template.Spec.Containers[0])
	}
	for i, ct := range d.Spec.Template.Spec.Containers {
		if !built[ct.Image] {
			t.Errorf("container %d runs %s; make image builds %v", i, ct.Image, tags)
		}
		if ct.ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("container %d: imagePullPolicy %q, want IfNotPresent (a loaded image must not be pulled)", i, ct.ImagePullPolicy)
		}
	}
}
