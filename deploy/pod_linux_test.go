//go:build linux

package deploy

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
)

// A pod here is what the kubelet makes of a rendered pod spec, on this
// machine: a network namespace of its own (held by a process, as the pause
// container holds a pod's), with only loopback, so that the containers
// listen on the ports their command lines name, and collide as they would
// in the cluster, without touching the host's ports. Each container runs
// there with its arguments and environment resolved as the kubelet resolves
// them (Secrets, ConfigMaps, $(VAR) references), its volumes written to
// directories that stand in for their mount paths, and as the user its
// securityContext names. Probes run inside the namespace too.
//
// The test binary plays two parts for it, chosen by CHARON_DEPLOY_POD in
// TestMain: "holder" (in a new network namespace: loopback up, then wait to
// be killed) and "probe" (an HTTP probe, as the kubelet's: HTTPS without
// verifying the certificate).

// The pod parts run before any test (and never return).
func init() { podMode() }

// podMode runs the test binary's pod parts; it returns only when the
// binary runs as a test.
func podMode() {
	switch os.Getenv("CHARON_DEPLOY_POD") {
	case "holder":
		if err := loopbackUp(); err != nil {
			fmt.Fprintln(os.Stderr, "holder:", err)
			os.Exit(1)
		}
		fmt.Println("up")
		select {}
	case "probe":
		var p httpProbe
		if err := json.Unmarshal([]byte(os.Getenv("CHARON_DEPLOY_PROBE")), &p); err != nil {
			fmt.Fprintln(os.Stderr, "probe:", err)
			os.Exit(2)
		}
		status, body, err := p.do()
		if err != nil {
			fmt.Print(err.Error())
			os.Exit(1)
		}
		fmt.Printf("%d\n%s", status, body)
		os.Exit(0)
	}
}

// loopbackUp brings up lo, the one interface of a new network namespace.
func loopbackUp() error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	var ifr [40]byte // struct ifreq: the name, then the flags
	copy(ifr[:], "lo")
	*(*uint16)(unsafe.Pointer(&ifr[syscall.IFNAMSIZ])) = syscall.IFF_UP | syscall.IFF_LOOPBACK | syscall.IFF_RUNNING
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.SIOCSIFFLAGS, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
		return e
	}
	return nil
}

// httpProbe is one HTTP request made from inside a pod.
type httpProbe struct {
	Scheme, Port, Path, Token string
	// CertFile and KeyFile: a client certificate to present.
	CertFile, KeyFile string
}

func (p httpProbe) do() (int, string, error) {
	if p.Scheme == "tcp" {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+p.Port, 2*time.Second)
		if err != nil {
			return 0, "", err
		}
		c.Close()
		return 0, "", nil
	}
	cfg := &tls.Config{InsecureSkipVerify: true}
	if p.CertFile != "" {
		c, err := tls.LoadX509KeyPair(p.CertFile, p.KeyFile)
		if err != nil {
			return 0, "", err
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	req, err := http.NewRequest("GET", (&url.URL{Scheme: p.Scheme, Host: "127.0.0.1:" + p.Port, Path: p.Path}).String(), nil)
	if err != nil {
		return 0, "", err
	}
	if p.Token != "" {
		req.Header.Set("Authorization", "Bearer "+p.Token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), nil
}

// pod is a running pod: its namespace holder and its containers.
type pod struct {
	t     *testing.T
	netns string // /proc/PID/ns/net of the holder
	dir   string // the volumes' directories
	objs  []object
	// hosts are Service names the containers reach inside the pod (their
	// URLs are rewritten to loopback).
	hosts []string
}

// newPod starts a pod's network namespace. It needs root (CI runs as root);
// elsewhere the test is skipped unless CHARON_REQUIRE_PODS is set.
func newPod(t *testing.T, objs []object, hosts ...string) *pod {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	holder := exec.Command(self)
	holder.Env = append(os.Environ(), "CHARON_DEPLOY_POD=holder")
	holder.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	holder.Stderr = &stderr
	if err := holder.Start(); err != nil {
		if os.Getenv("CHARON_REQUIRE_PODS") == "" {
			t.Skipf("no network namespace for a pod (needs root): %v", err)
		}
		t.Fatalf("network namespace for a pod: %v (CHARON_REQUIRE_PODS is set)", err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "up\n" {
		t.Fatalf("pod network namespace: %q %v %s", line, err, stderr.String())
	}
	dir := t.TempDir()
	// The containers run as their own users: they must reach the volumes.
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o755)
	return &pod{t: t, netns: fmt.Sprintf("/proc/%d/ns/net", holder.Process.Pid), dir: dir, objs: objs, hosts: hosts}
}

// container is a started container.
type container struct {
	name   string
	spec   corev1.Container
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	exited chan struct{}
	// mounts maps each mount path to its directory.
	mounts map[string]string
}

// start runs container c of pod spec ps, with bin as its image's entrypoint
// (c.Command, when set, names it instead).
func (p *pod) start(ps corev1.PodSpec, c corev1.Container, bin string) *container {
	t := p.t
	t.Helper()
	ct := &container{name: c.Name, spec: c, stderr: new(bytes.Buffer), exited: make(chan struct{}), mounts: map[string]string{}}
	for _, m := range c.VolumeMounts {
		ct.mounts[m.MountPath] = p.volume(ps, m.Name, c.Name)
	}
	env := p.env(c)
	args := make([]string, 0, len(c.Command)+len(c.Args))
	for _, a := range append(slices.Clone(c.Command), c.Args...) {
		args = append(args, p.rewrite(ct.mounts, expand(a, env)))
	}
	if len(c.Command) > 0 {
		bin, args = args[0], args[1:]
		if bin == "charon" || bin == "/usr/local/bin/charon" {
			bin = charonBin(t)
		}
	}
	nsArgs := []string{"--net=" + p.netns}
	uid, gid := runAs(ps, c)
	if uid >= 0 {
		nsArgs = append(nsArgs, "--setuid", strconv.FormatInt(uid, 10), "--setgid", strconv.FormatInt(max(gid, 0), 10))
	}
	ct.cmd = exec.Command("nsenter", append(append(nsArgs, "--", bin), args...)...)
	ct.cmd.Dir = p.dir
	ct.cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/nonexistent"}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range env {
			if !yield(k) {
				return
			}
		}
	}) {
		ct.cmd.Env = append(ct.cmd.Env, k+"="+p.rewrite(ct.mounts, env[k]))
	}
	ct.cmd.Stdout, ct.cmd.Stderr = ct.stderr, ct.stderr
	if err := ct.cmd.Start(); err != nil {
		t.Fatalf("container %s: %v", c.Name, err)
	}
	go func() { ct.cmd.Wait(); close(ct.exited) }()
	t.Cleanup(func() {
		ct.cmd.Process.Kill()
		<-ct.exited
	})
	return ct
}

// runAs is the user and group a container runs as (-1: unset).
func runAs(ps corev1.PodSpec, c corev1.Container) (uid, gid int64) {
	uid, gid = -1, -1
	if sc := ps.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = *sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = *sc.RunAsGroup
		}
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = *sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = *sc.RunAsGroup
		}
	}
	return uid, gid
}

// volume writes the files of volume name (a ConfigMap, a Secret, or an
// emptyDir) to a directory, as the kubelet projects them.
func (p *pod) volume(ps corev1.PodSpec, name, containerName string) string {
	t := p.t
	t.Helper()
	var v *corev1.Volume
	for i := range ps.Volumes {
		if ps.Volumes[i].Name == name {
			v = &ps.Volumes[i]
		}
	}
	if v == nil {
		t.Fatalf("container %s mounts %s, which is no volume of the pod", containerName, name)
	}
	dir := filepath.Join(p.dir, containerName+"-"+name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var data map[string][]byte
	var items []corev1.KeyToPath
	switch {
	case v.ConfigMap != nil:
		cm, ok := find[*corev1.ConfigMap](p.objs, "ConfigMap", v.ConfigMap.Name)
		if !ok {
			t.Fatalf("volume %s: no ConfigMap %s", name, v.ConfigMap.Name)
		}
		data = map[string][]byte{}
		for k, s := range cm.Data {
			data[k] = []byte(s)
		}
		items = v.ConfigMap.Items
	case v.Secret != nil:
		data = p.secretData(v.Secret.SecretName)
		if data == nil {
			t.Fatalf("volume %s: no Secret %s", name, v.Secret.SecretName)
		}
		items = v.Secret.Items
	case v.EmptyDir != nil:
		return dir
	case v.HostPath != nil:
		return v.HostPath.Path
	default:
		t.Fatalf("volume %s: a kind this test does not project", name)
	}
	if items == nil {
		for k := range data {
			items = append(items, corev1.KeyToPath{Key: k, Path: k})
		}
	}
	for _, it := range items {
		b, ok := data[it.Key]
		if !ok {
			t.Fatalf("volume %s: no key %s (the kubelet would not start the pod)", name, it.Key)
		}
		f := filepath.Join(dir, it.Path)
		os.MkdirAll(filepath.Dir(f), 0o755)
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// secretData is Secret name's data (stringData merged in), or nil.
func (p *pod) secretData(name string) map[string][]byte {
	s, ok := find[*corev1.Secret](p.objs, "Secret", name)
	if !ok {
		return nil
	}
	data := map[string][]byte{}
	for k, v := range s.Data {
		data[k] = v
	}
	for k, v := range s.StringData {
		data[k] = []byte(v)
	}
	return data
}

// env resolves a container's environment as the kubelet does.
func (p *pod) env(c corev1.Container) map[string]string {
	t := p.t
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = expand(e.Value, env)
		case e.ValueFrom.SecretKeyRef != nil:
			r := e.ValueFrom.SecretKeyRef
			b, ok := p.secretData(r.Name)[r.Key]
			if !ok {
				t.Fatalf("env %s: no key %s in Secret %s", e.Name, r.Key, r.Name)
			}
			env[e.Name] = string(b)
		case e.ValueFrom.ConfigMapKeyRef != nil:
			r := e.ValueFrom.ConfigMapKeyRef
			cm, ok := find[*corev1.ConfigMap](p.objs, "ConfigMap", r.Name)
			if !ok {
				t.Fatalf("env %s: no ConfigMap %s", e.Name, r.Name)
			}
			env[e.Name] = cm.Data[r.Key]
		case e.ValueFrom.FieldRef != nil:
			env[e.Name] = map[string]string{"metadata.name": "charon-0", "metadata.namespace": "charon", "status.podIP": "127.0.0.1"}[e.ValueFrom.FieldRef.FieldPath]
		default:
			t.Fatalf("env %s: a source this test does not resolve", e.Name)
		}
	}
	return env
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand replaces $(VAR) with the container's variable, as the kubelet does
// in arguments (an unknown one stays as written).
func expand(s string, env map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		if v, ok := env[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

// rewrite maps mount paths to their directories, and the pod's Service
// hosts to loopback.
func (p *pod) rewrite(mounts map[string]string, s string) string {
	for _, mp := range slices.Sorted(func(yield func(string) bool) {
		for k := range mounts {
			if !yield(k) {
				return
			}
		}
	}) {
		if s == mp || strings.HasPrefix(s, mp+"/") || strings.Contains(s, "="+mp) {
			s = strings.Replace(s, mp, mounts[mp], 1)
		}
	}
	for _, h := range p.hosts {
		s = strings.ReplaceAll(s, "//"+h+":", "//127.0.0.1:")
	}
	return s
}

// inPod runs a command in the pod's network namespace, as root.
func (p *pod) inPod(env []string, name string, args ...string) (string, error) {
	cmd := exec.Command("nsenter", append([]string{"--net=" + p.netns, "--", name}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// get makes an HTTP request from inside the pod.
func (p *pod) get(pr httpProbe) (int, string, error) {
	self, err := os.Executable()
	if err != nil {
		p.t.Fatal(err)
	}
	b, _ := json.Marshal(pr)
	out, err := p.inPod([]string{"CHARON_DEPLOY_POD=probe", "CHARON_DEPLOY_PROBE=" + string(b)}, self)
	if err != nil {
		return 0, "", fmt.Errorf("%s", out)
	}
	code, body, _ := strings.Cut(out, "\n")
	n, _ := strconv.Atoi(code)
	return n, body, nil
}

// probe runs a Kubernetes probe of c inside the pod.
func (p *pod) probe(c *container, pr *corev1.Probe) error {
	port := func(ip intstrOrString) string {
		if ip.name != "" {
			for _, cp := range c.spec.Ports {
				if cp.Name == ip.name {
					return strconv.Itoa(int(cp.ContainerPort))
				}
			}
			return "no-port-named-" + ip.name
		}
		return strconv.Itoa(ip.num)
	}
	switch h := pr.ProbeHandler; {
	case h.GRPC != nil:
		args := []string{"health", "--addr", "127.0.0.1:" + strconv.Itoa(int(h.GRPC.Port)), "--timeout", "2s"}
		if h.GRPC.Service != nil {
			args = append(args, "--service", *h.GRPC.Service)
		}
		if out, err := p.inPod(nil, charonBin(p.t), args...); err != nil {
			return fmt.Errorf("gRPC health: %v: %s", err, out)
		}
	case h.HTTPGet != nil:
		scheme := strings.ToLower(string(h.HTTPGet.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		code, body, err := p.get(httpProbe{Scheme: scheme, Port: port(intstr(h.HTTPGet.Port.IntVal, h.HTTPGet.Port.StrVal)), Path: h.HTTPGet.Path})
		if err != nil {
			return err
		}
		if code < 200 || code >= 400 {
			return fmt.Errorf("%s %s: %d %s", scheme, h.HTTPGet.Path, code, body)
		}
	case h.TCPSocket != nil:
		if _, _, err := p.get(httpProbe{Scheme: "tcp", Port: port(intstr(h.TCPSocket.Port.IntVal, h.TCPSocket.Port.StrVal))}); err != nil {
			return fmt.Errorf("TCP connect: %v", err)
		}
	default:
		return fmt.Errorf("a probe kind this test does not run")
	}
	return nil
}

type intstrOrString struct {
	num  int
	name string
}

func intstr(n int32, s string) intstrOrString { return intstrOrString{int(n), s} }

// waitReady runs c's startup and readiness probes until both pass, failing
// the test with the container's output when it exits first (a crash loop)
// or does not become ready within 30 s.
func (p *pod) waitReady(c *container) {
	t := p.t
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for {
		select {
		case <-c.exited:
			t.Fatalf("container %s exited: it would crash-loop\nargs: %q\n%s", c.name, c.cmd.Args, c.stderr.String())
		default:
		}
		last = nil
		for _, pr := range []*corev1.Probe{c.spec.StartupProbe, c.spec.ReadinessProbe, c.spec.LivenessProbe} {
			if pr != nil && last == nil {
				last = p.probe(c, pr)
			}
		}
		if last == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s not ready in 30 s: %v\nargs: %q\n%s", c.name, last, c.cmd.Args, c.stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// listenSock is a listening TCP socket of a process.
type listenSock struct {
	port     int
	wildcard bool // every address, not loopback alone
}

// listening returns the TCP sockets c listens on, read from its network
// namespace's /proc tables.
func (p *pod) listening(c *container) []listenSock {
	t := p.t
	var socks []listenSock
	for _, f := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", c.cmd.Process.Pid, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 4 || fs[3] != "0A" { // LISTEN
				continue
			}
			ip, port, _ := strings.Cut(fs[1], ":")
			n, _ := strconv.ParseInt(port, 16, 32)
			raw, _ := hex.DecodeString(ip)
			socks = append(socks, listenSock{port: int(n), wildcard: !slices.ContainsFunc(raw, func(b byte) bool { return b != 0 })})
		}
	}
	return socks
}

// tlsFiles makes a CA, a server certificate for 127.0.0.1 and localhost,
// and a client certificate whose identity is the URI id, as a
// kubernetes.io/tls Secret's data (tls.crt, tls.key, ca.crt) and the
// client's PEM pair.
func tlsFiles(t *testing.T, id string) (secret map[string][]byte, clientCert, clientKey []byte) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	pemOf := func(typ string, b []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}) }
	keyPEM := func(k *ecdsa.PrivateKey) []byte {
		b, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return pemOf("EC PRIVATE KEY", b)
	}
	now := time.Now()
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: now.Add(-time.Hour),
		NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	srvKey := key()
	srvDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "charon"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), DNSNames: []string{"localhost", "charon.charon.svc"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(id)
	cliKey := key()
	cliDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "client"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), URIs: []*url.URL{u},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, ca, &cliKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{"tls.crt": pemOf("CERTIFICATE", srvDER), "tls.key": keyPEM(srvKey), "ca.crt": pemOf("CERTIFICATE", caDER)},
		pemOf("CERTIFICATE", cliDER), keyPEM(cliKey)
}
