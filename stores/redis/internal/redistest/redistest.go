// Package redistest starts private redis-server processes for tests that
// must restart a server or run a cluster: the shared Redis is never stopped,
// restarted or flushed.
//
// Servers listen on spare loopback ports, keep their files in a temporary
// directory of the test, and are killed when the test ends. When
// redis-server (or redis-cli, for clusters) is not installed the test skips,
// recording the skip for `make test`'s summary, or fails when
// INBOX_REQUIRE_SERVICES=1.
package redistest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox/internal/testenv"
)

const howTo = "install redis-server and redis-cli (Debian package redis-server)"

// binary returns the path of name, or skips or fails the test.
func binary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	msg := fmt.Sprintf("%s not found (%v): %s", name, err, howTo)
	if testenv.RequireServices() {
		t.Fatalf("%s; INBOX_REQUIRE_SERVICES is set, so this is a failure", msg)
	}
	testenv.RecordSkip(name, howTo)
	t.Skip(msg)
	return ""
}

// Config says how to run a server.
type Config struct {
	// AppendOnly turns on append-only persistence with appendfsync always,
	// so every write a client saw acknowledged survives a crash.
	AppendOnly bool
	// Cluster starts the server with cluster-enabled (its bus port, port +
	// 10000, must be free too).
	Cluster bool
	// ReplicaOf, "host:port", starts the server as a replica of that one.
	ReplicaOf string
	// Monitor, with MasterName, starts a Sentinel (redis-server
	// --sentinel) instead of a data server, watching the master at this
	// address ("host:port") under that name, with a quorum of 1.
	Monitor, MasterName string
	// TLS serves TLS only, with a self-signed certificate for 127.0.0.1
	// made for the server (Server.CertPool trusts it); clients need no
	// certificate of their own.
	TLS bool
	// Password, when set, is required of clients (requirepass: the password
	// of the default user).
	Password string
	// Args are more arguments of redis-server, after the others (for
	// example "--maxmemory-policy", "volatile-lru").
	Args []string
}

// Server is a redis-server process that a test started.
type Server struct {
	t    testing.TB
	bin  string
	cfg  Config
	Port int
	Dir  string
	// CertPool trusts the server's certificate (Config.TLS).
	CertPool *x509.CertPool

	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

// Addr is "127.0.0.1:port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// Start runs a redis-server on a spare loopback port, waits until it answers
// PING, and kills it when the test ends.
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	s := &Server{t: t, bin: binary(t, "redis-server"), cfg: cfg, Dir: t.TempDir()}
	t.Cleanup(s.Kill)
	if cfg.TLS {
		_, _, s.CertPool = testenv.SelfSignedCert(t, s.Dir)
	}
	var last error
	for range 10 {
		port, err := freePort(cfg.Cluster)
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s.Port = port
		if last = s.launch(); last == nil {
			return s
		}
		// Most likely another process took the port in between: try another.
	}
	t.Fatalf("redistest: could not start redis-server: %v", last)
	return nil
}

// freePort returns a loopback port that was free a moment ago (and its
// cluster bus port, port + 10000, when bus is set).
func freePort(bus bool) (int, error) {
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		if !bus {
			return port, nil
		}
		if port+10000 > 65535 {
			continue
		}
		ln2, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		if err != nil {
			continue
		}
		_ = ln2.Close()
		return port, nil
	}
	return 0, errors.New("no free loopback port found")
}

func (s *Server) args() ([]string, error) {
	if s.cfg.Monitor != "" {
		return s.sentinelArgs()
	}
	a := []string{
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--dir", s.Dir,
		"--daemonize", "no", "--save", "", "--logfile", filepath.Join(s.Dir, "redis.log"),
	}
	if s.cfg.TLS { // TLS on the port, no plain TCP at all
		a[1] = "0"
		a = append(a, "--tls-port", strconv.Itoa(s.Port),
			"--tls-cert-file", filepath.Join(s.Dir, "cert.pem"), "--tls-key-file", filepath.Join(s.Dir, "key.pem"),
			"--tls-ca-cert-file", filepath.Join(s.Dir, "cert.pem"), "--tls-auth-clients", "no")
	}
	if s.cfg.ReplicaOf != "" {
		host, port, err := net.SplitHostPort(s.cfg.ReplicaOf)
		if err != nil {
			return nil, fmt.Errorf("redistest: Config.ReplicaOf %q: %w", s.cfg.ReplicaOf, err)
		}
		a = append(a, "--replicaof", host, port)
	}
	if s.cfg.Password != "" {
		a = append(a, "--requirepass", s.cfg.Password)
	}
	if s.cfg.AppendOnly {
		a = append(a, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		a = append(a, "--appendonly", "no")
	}
	if s.cfg.Cluster {
		a = append(a, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(s.Dir, "nodes.conf"))
	}
	return append(a, s.cfg.Args...), nil
}

// sentinelArgs writes a Sentinel's configuration file, which Sentinel
// rewrites as it learns (so it must be writable), and returns the arguments
// that run it. A restart keeps the file Sentinel left.
func (s *Server) sentinelArgs() ([]string, error) {
	host, port, err := net.SplitHostPort(s.cfg.Monitor)
	if err != nil {
		return nil, fmt.Errorf("redistest: Config.Monitor %q: %w", s.cfg.Monitor, err)
	}
	conf := filepath.Join(s.Dir, "sentinel.conf")
	if _, err := os.Stat(conf); errors.Is(err, os.ErrNotExist) {
		n := s.cfg.MasterName
		text := fmt.Sprintf("sentinel monitor %s %s %s 1\n"+
			"sentinel down-after-milliseconds %s 1000\n"+
			"sentinel failover-timeout %s 5000\n", n, host, port, n, n)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			return nil, err
		}
	}
	return []string{
		conf, "--sentinel", "--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--dir", s.Dir,
		"--daemonize", "no", "--logfile", filepath.Join(s.Dir, "redis.log"),
	}, nil
}

// launch starts the process on s.Port and waits for PING.
func (s *Server) launch() error {
	args, err := s.args()
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.cmd, s.done = cmd, done
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), Password: s.cfg.Password, MaxRetries: -1, DialTimeout: time.Second, TLSConfig: s.TLSConfig()})
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited at start; its log: %s", s.Port, s.log())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			s.Kill()
			return fmt.Errorf("redis-server on port %d does not answer PING after 30s: %v", s.Port, err)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

func (s *Server) log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Kill ends the process with SIGKILL (a crash: nothing is flushed) and waits
// for it. Killing a stopped server does nothing.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
}

// Shutdown stops the server with the SHUTDOWN command (a clean stop) and
// waits until the process has exited.
func (s *Server) Shutdown() {
	s.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), Password: s.cfg.Password, MaxRetries: -1, TLSConfig: s.TLSConfig()})
	defer c.Close()
	// SHUTDOWN closes the connection instead of answering.
	_ = c.Shutdown(context.Background()).Err()
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		s.t.Fatalf("redistest: redis-server on port %d still running 30s after SHUTDOWN", s.Port)
	}
}

// Restart starts the stopped server again on the same port and directory,
// so it loads what it persisted. It waits for the old process to exit.
func (s *Server) Restart() {
	s.t.Helper()
	<-s.done
	var err error
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err = s.launch(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: restart on port %d: %v", s.Port, err)
		}
		time.Sleep(100 * time.Millisecond) // the port may linger a moment; poll
	}
}

// StartCluster starts n cluster-enabled servers (masters, no replicas),
// joins them with `redis-cli --cluster create` and waits until every node
// reports cluster_state:ok. It returns their addresses; the servers are
// killed when the test ends.
func StartCluster(t testing.TB, n int) []string {
	t.Helper()
	cli := binary(t, "redis-cli")
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = Start(t, Config{Cluster: true}).Addr()
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	var out bytes.Buffer
	cmd := exec.Command(cli, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)) {
				break
			}
			if time.Now().After(deadline) {
				_ = c.Close()
				t.Fatalf("redistest: node %s not ok 60s after cluster create: %v\n%s", a, err, info)
			}
			time.Sleep(50 * time.Millisecond) // polling interval
		}
		_ = c.Close()
	}
	return addrs
}

// StartSentinel starts a Sentinel that watches master under name and waits
// until it reports that master and as many replicas as the master has
// online (start the replicas first: Sentinel learns of them from the
// master's INFO). The Sentinel is killed when the test ends.
func StartSentinel(t testing.TB, master *Server, name string) *Server {
	t.Helper()
	ctx := context.Background()
	mc := redis.NewClient(&redis.Options{Addr: master.Addr()})
	defer mc.Close()
	info, err := mc.Info(ctx, "replication").Result()
	if err != nil {
		t.Fatalf("redistest: INFO replication of %s: %v", master.Addr(), err)
	}
	replicas := strings.Count(info, "state=online")

	s := Start(t, Config{Monitor: master.Addr(), MasterName: name})
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr()})
	defer sc.Close()
	testenv.Eventually(t, 60*time.Second, "Sentinel "+s.Addr()+" reports master "+master.Addr()+" and its replicas", func() bool {
		addr, err := sc.GetMasterAddrByName(ctx, name).Result()
		if err != nil || len(addr) != 2 || net.JoinHostPort(addr[0], addr[1]) != master.Addr() {
			return false
		}
		rs, err := sc.Replicas(ctx, name).Result()
		if err != nil || len(rs) != replicas {
			return false
		}
		// Sentinel promotes only a replica it is linked to and whose own
		// INFO says its link to the master is up.
		for _, r := range rs {
			if r["flags"] != "slave" || r["master-link-status"] != "ok" {
				return false
			}
		}
		return true
	})
	return s
}

// WaitReplicaOnline waits until master reports n replicas online.
func WaitReplicaOnline(t testing.TB, master *Server, n int) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: master.Addr()})
	defer c.Close()
	testenv.Eventually(t, 60*time.Second, fmt.Sprintf("%d replicas online at %s", n, master.Addr()), func() bool {
		info, err := c.Info(context.Background(), "replication").Result()
		return err == nil && strings.Count(info, "state=online") == n
	})
}

// TLSConfig is a client configuration that trusts the server's certificate,
// or nil when the server does not serve TLS.
func (s *Server) TLSConfig() *tls.Config {
	if !s.cfg.TLS {
		return nil
	}
	return &tls.Config{RootCAs: s.CertPool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}
