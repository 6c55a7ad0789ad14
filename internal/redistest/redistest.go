// Package redistest starts real redis-server processes on free loopback ports
// for tests: a single node, a Cluster of masters, and a master with a replica
// watched by a Sentinel. Every process is stopped, by PID, when the test ends.
//
// When redis-server is not installed the tests that need it are skipped, unless
// CHARON_REQUIRE_REDIS is set (CI sets it), in which case they fail.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Node is one running redis-server (or sentinel) process.
type Node struct {
	Port int
	Dir  string
	cmd  *exec.Cmd
	mu   sync.Mutex
	done chan struct{}
	args []string // what it was started with
}

// Addr is the node's "127.0.0.1:port".
func (n *Node) Addr() string { return "127.0.0.1:" + strconv.Itoa(n.Port) }

// Kill stops the node with SIGKILL and waits for it to exit.
func (n *Node) Kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.done
	n.cmd = nil
}

// Restart starts a killed node again on the same port with args, or with
// the arguments it was first started with when none are given (a Cluster
// node then rejoins its Cluster from its nodes.conf).
func (n *Node) Restart(t testing.TB, args ...string) {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		t.Fatalf("redistest: node %d is running", n.Port)
	}
	if len(args) == 0 {
		args = n.args
	}
	n.start(t, args)
	waitPing(t, n.Port)
}

func (n *Node) start(t testing.TB, args []string) {
	t.Helper()
	cmd := exec.Command(serverPath(t), args...)
	cmd.Dir = n.Dir
	logf, err := os.Create(filepath.Join(n.Dir, "log.txt"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = logf
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("redistest: start redis-server: %v", err)
	}
	n.cmd = cmd
	n.done = make(chan struct{})
	go func(done chan struct{}) {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}(n.done)
}

var (
	pathOnce sync.Once
	path     string
)

func serverPath(t testing.TB) string {
	t.Helper()
	pathOnce.Do(func() { path, _ = exec.LookPath("redis-server") })
	if path == "" {
		if os.Getenv("CHARON_REQUIRE_REDIS") != "" {
			t.Fatal("redistest: redis-server not found and CHARON_REQUIRE_REDIS is set")
		}
		t.Skip("redistest: redis-server not installed (apt-get install redis-server); skipping")
	}
	return path
}

var (
	portMu sync.Mutex
	given  = map[int]bool{} // ports handed out by this process, never twice
)

// freePort returns a loopback port that is free, and whose cluster bus port
// (port+10000) is free too.
func freePort(t testing.TB) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	for i := 0; i < 100; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if p+10000 > 65535 || given[p] || given[p+10000] || given[p-10000] {
			continue
		}
		if l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000)); err == nil {
			l2.Close()
			given[p] = true
			return p
		}
	}
	t.Fatal("redistest: no free port pair")
	return 0
}

func baseArgs(port int, dir string) []string {
	return []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--protected-mode", "no"}
}

// nodeDir returns a free port and a new directory for a node on it.
func nodeDir(t testing.TB) (int, string) {
	t.Helper()
	port := freePort(t)
	dir := filepath.Join(t.TempDir(), strconv.Itoa(port))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return port, dir
}

// newNode starts redis-server with the base arguments and extra on a free
// port, in a directory of its own (where relative paths in extra point),
// killed when the test ends. Unless it needs a password, it returns once the
// node answers, and only once the process answering on its port is this one:
// a port found free may be taken by another process before redis-server binds
// it (redis-server then exits), and the node is started again on another.
func newNode(t testing.TB, extra ...string) (*Node, []string) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		port, dir := nodeDir(t)
		args := append(baseArgs(port, dir), extra...)
		n := &Node{Port: port, Dir: dir, args: args}
		n.start(t, args)
		t.Cleanup(n.Kill)
		if slices.Contains(extra, "--requirepass") || n.answersAsItself() {
			return n, args
		}
		n.Kill()
		if attempt == 4 {
			t.Fatalf("redistest: redis-server did not come up on a port of its own (last %d); its log:\n%s", port, n.log())
		}
	}
}

// answersAsItself waits until the node answers PING and reports whether the
// process answering is the one started (INFO's process_id), false when it
// exited or another process answers.
func (n *Node) answersAsItself() bool {
	pid := "process_id:" + strconv.Itoa(n.cmd.Process.Pid)
	var mine bool
	poll(10*time.Second, 20*time.Millisecond, func() bool {
		select {
		case <-n.done:
			return true // exited: port taken
		default:
		}
		if !ping(n.Port) {
			return false
		}
		out, _ := cli(n.Port, "info", "server")
		mine = strings.Contains(out, pid+"\r") || strings.Contains(out, pid+"\n")
		return true
	})
	return mine
}

func (n *Node) log() string {
	b, _ := os.ReadFile(filepath.Join(n.Dir, "log.txt"))
	return string(b)
}

// Single starts one redis-server and waits until it answers PING.
func Single(t testing.TB) *Node {
	t.Helper()
	serverPath(t)
	n, _ := newNode(t)
	waitPing(t, n.Port)
	return n
}

// SingleTLS starts a redis-server that speaks only TLS on its port, with
// the server certificate and key given, verifying client certificates
// against caFile when clientCerts is set. tlsPing checks it answers.
func SingleTLS(t testing.TB, certFile, keyFile, caFile string, clientCerts bool) *Node {
	t.Helper()
	serverPath(t)
	auth := "no"
	if clientCerts {
		auth = "yes"
	}
	port, dir := nodeDir(t)
	args := append(baseArgs(port, dir), "--port", "0", "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", auth)
	n := &Node{Port: port, Dir: dir}
	n.start(t, args)
	t.Cleanup(n.Kill)
	waitAccept(t, n)
	return n
}

// SinglePassword starts a redis-server that requires password (AUTH).
func SinglePassword(t testing.TB, password string) *Node {
	t.Helper()
	serverPath(t)
	n, _ := newNode(t, "--requirepass", password)
	waitAccept(t, n)
	return n
}

// waitAccept waits until n accepts connections (for nodes that do not
// answer a bare PING).
func waitAccept(t testing.TB, n *Node) {
	t.Helper()
	if !poll(10*time.Second, 20*time.Millisecond, func() bool {
		c, err := net.DialTimeout("tcp", n.Addr(), 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	}) {
		t.Fatalf("redistest: redis on port %d did not accept connections", n.Port)
	}
}

// SingleArgs starts one redis-server and returns it with the arguments that
// Restart needs.
func SingleArgs(t testing.TB) (*Node, []string) {
	t.Helper()
	serverPath(t)
	n, args := newNode(t)
	waitPing(t, n.Port)
	return n, args
}

// Cluster starts masters cluster-enabled nodes, joins them into one cluster
// with no replicas and waits for cluster_state:ok.
func Cluster(t testing.TB, masters int) []*Node {
	t.Helper()
	serverPath(t)
	nodes := make([]*Node, masters)
	for i := range nodes {
		nodes[i], _ = newNode(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000")
	}
	for _, n := range nodes {
		waitPing(t, n.Port)
	}
	args := append([]string{"--cluster", "create"}, Addrs(nodes)...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: cluster create: %v\n%s", err, out)
	}
	ok := poll(20*time.Second, 50*time.Millisecond, func() bool {
		for _, n := range nodes {
			if out, _ := cli(n.Port, "cluster", "info"); !strings.Contains(out, "cluster_state:ok") {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatal("redistest: cluster did not reach cluster_state:ok")
	}
	return nodes
}

// Reshard moves slots hash slots of a Cluster from the master from to the
// master to (redis-cli --cluster reshard), and returns once they are moved.
// It returns an error rather than failing the test, so that the caller can
// stop its load first.
func Reshard(from, to *Node, slots int) error {
	var ids [2]string
	for i, n := range []*Node{from, to} {
		out, err := cli(n.Port, "cluster", "myid")
		if err != nil {
			return fmt.Errorf("redistest: cluster myid of %d: %v\n%s", n.Port, err, out)
		}
		ids[i] = strings.TrimSpace(out)
	}
	out, err := exec.Command("redis-cli", "--cluster", "reshard", from.Addr(), "--cluster-from", ids[0], "--cluster-to", ids[1],
		"--cluster-slots", strconv.Itoa(slots), "--cluster-yes").CombinedOutput()
	if err != nil {
		return fmt.Errorf("redistest: reshard: %v\n%s", err, out)
	}
	return nil
}

// Addrs returns the addresses of nodes, in order.
func Addrs(nodes []*Node) []string {
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// SentinelSet is a master, a replica and one Sentinel monitoring them as
// MasterName.
type SentinelSet struct {
	Master, Replica, Sentinel *Node
	MasterName                string
}

// Sentinel starts a master, a replica of it and a Sentinel with quorum 1 and
// a 1 s down-after period, and waits until the Sentinel knows the master.
func Sentinel(t testing.TB) *SentinelSet {
	t.Helper()
	serverPath(t)
	master, _ := newNode(t)
	waitPing(t, master.Port)
	replica, _ := newNode(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	waitPing(t, replica.Port)

	port, dir := nodeDir(t)
	conf := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\n"+
		"sentinel monitor mymaster 127.0.0.1 %d 1\n"+
		"sentinel down-after-milliseconds mymaster 1000\n"+
		"sentinel failover-timeout mymaster 5000\n", port, dir, master.Port)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &Node{Port: port, Dir: dir}
	s.start(t, []string{conf, "--sentinel"})
	t.Cleanup(s.Kill)
	waitPing(t, port)
	var out string
	if !poll(10*time.Second, 50*time.Millisecond, func() bool {
		out, _ = cli(port, "sentinel", "get-master-addr-by-name", "mymaster")
		return strings.Contains(out, strconv.Itoa(master.Port))
	}) {
		t.Fatalf("redistest: sentinel does not know the master: %q", out)
	}
	// Wait for the replica to be in sync so a failover has a candidate.
	if !poll(10*time.Second, 50*time.Millisecond, func() bool {
		out, _ := cli(replica.Port, "info", "replication")
		return strings.Contains(out, "master_link_status:up")
	}) {
		t.Fatal("redistest: replica did not sync")
	}
	return &SentinelSet{Master: master, Replica: replica, Sentinel: s, MasterName: "mymaster"}
}

// PauseWrites makes the node hold every write command its clients send (an
// FCALL of a function that writes included) until the returned resume is
// called, or the test ends: it answers them late, as a stalled master does,
// and applies them when it resumes (CLIENT PAUSE WRITE, CLIENT UNPAUSE).
// Reads, and other clients' CLIENT commands, go on.
func (n *Node) PauseWrites(t testing.TB) (resume func()) {
	t.Helper()
	if out, err := cli(n.Port, "client", "pause", "600000", "write"); err != nil || !strings.Contains(out, "OK") {
		t.Fatalf("redistest: CLIENT PAUSE on port %d: %v %s", n.Port, err, out)
	}
	var once sync.Once
	resume = func() {
		once.Do(func() { _, _ = cli(n.Port, "client", "unpause") })
	}
	t.Cleanup(resume)
	return resume
}

// CLI runs redis-cli against port and returns its output.
func CLI(port int, args ...string) (string, error) { return cli(port, args...) }

func cli(port int, args ...string) (string, error) {
	out, err := exec.Command("redis-cli", append([]string{"-p", strconv.Itoa(port)}, args...)...).CombinedOutput()
	return string(out), err
}

func waitPing(t testing.TB, port int) {
	t.Helper()
	if !poll(10*time.Second, 20*time.Millisecond, func() bool { return ping(port) }) {
		t.Fatalf("redistest: redis on port %d did not answer PING", port)
	}
}

// poll calls cond every pause until it holds or timeout has passed, and
// reports whether it held.
func poll(timeout, pause time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
	}
}

func ping(port int) bool {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 200*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}
