package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores"
	"github.com/watermill-inbox/inbox/stores/memory"
	"github.com/watermill-inbox/inbox/stores/remote"
)

// gated is a memory store whose TryBegin on a key starting with "slow:"
// creates the file "entered" in dir and then waits for the file "release":
// a request held in flight, across processes.
type gated struct {
	*memory.Store
	dir string
}

func (g gated) TryBegin(ctx context.Context, key string, o inbox.BeginOptions) (inbox.Claim, error) {
	if strings.HasPrefix(key, "slow:") {
		if err := os.WriteFile(filepath.Join(g.dir, "entered"), nil, 0o600); err != nil {
			return inbox.Claim{}, err
		}
		for {
			if _, err := os.Stat(filepath.Join(g.dir, "release")); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return inbox.Claim{}, ctx.Err()
			case <-time.After(5 * time.Millisecond): // polling a file written by another process
			}
		}
	}
	return g.Store.TryBegin(ctx, key, o)
}

func init() {
	stores.Register("gatetest", stores.OpenerFunc(func(_ context.Context, u *url.URL, _ stores.Params) (stores.Store, error) {
		m, err := memory.New(memory.Options{})
		if err != nil {
			return nil, err
		}
		return gated{Store: m, dir: u.Query().Get("dir")}, nil
	}))
}

// TestMain runs main itself when re-executed by TestMain_SIGTERM.
func TestMain(m *testing.M) {
	if os.Getenv("INBOXD_TEST_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// syncBuffer is a log sink safe for concurrent writes and reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// startRun runs run in the background and returns its address, its logs,
// the function that stops it (as SIGTERM would) and its result.
func startRun(t *testing.T, vars map[string]string) (addr string, logs *syncBuffer, stop func(), result <-chan error) {
	t.Helper()
	return startRunReloadable(t, vars, nil)
}

// startRunReloadable is startRun with reload as run's reload channel (what
// SIGHUP feeds in main).
func startRunReloadable(t *testing.T, vars map[string]string, reload <-chan os.Signal) (addr string, logs *syncBuffer, stop func(), result <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs = &syncBuffer{}
	ready := make(chan string, 1)
	res := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		res <- run(ctx, nil, env(vars), logs, ready, reload)
	}()
	select {
	case addr = <-ready:
	case err := <-res:
		cancel()
		t.Fatalf("run: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("inboxd did not start")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("inboxd did not stop within 10s")
		}
	})
	return addr, logs, cancel, res
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(5 * time.Millisecond) // polling; the file decides
	}
}

// waitRefused polls until addr refuses connections.
func waitRefused(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return
		}
		_ = c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("%s still accepts connections after shutdown began", addr)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// slowTryBegin sends a try-begin that the gated store holds, and returns the
// channel of its HTTP status.
func slowTryBegin(addr string) <-chan string {
	out := make(chan string, 1)
	go func() {
		resp, err := http.Post("http://"+addr+"/v1/inbox/try-begin", "application/json", strings.NewReader(`{"key":"slow:1"}`))
		if err != nil {
			out <- "error: " + err.Error()
			return
		}
		defer resp.Body.Close()
		var body struct{ Status string }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		out <- fmt.Sprintf("%d %s", resp.StatusCode, body.Status)
	}()
	return out
}

func TestRun_shutdown_finishes_requests_in_flight(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	addr, logs, stop, result := startRun(t, map[string]string{
		"INBOX_STORE_URL": "gatetest://?dir=" + url.QueryEscape(dir), "INBOX_LISTEN_ADDR": "127.0.0.1:0",
	})
	answer := slowTryBegin(addr)
	waitFile(t, filepath.Join(dir, "entered"))
	stop()
	waitRefused(t, addr)
	select {
	case a := <-answer:
		t.Fatalf("request in flight answered before the store did: %s", a)
	default:
	}
	if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if a := <-answer; a != "200 Acquired" {
		t.Fatalf("request in flight during shutdown got %q, want 200 Acquired", a)
	}
	if err := <-result; err != nil {
		t.Fatalf("run after shutdown: %v", err)
	}
	for _, want := range []string{`"msg":"inboxd listening"`, `"msg":"inboxd shutting down`, `"msg":"inboxd stopped"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %s:\n%s", want, logs)
		}
	}
}

// The real signal path: main in a child process, SIGTERM while a request is
// in flight.
func TestMain_SIGTERM_finishes_requests_in_flight(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "INBOXD_TEST_RUN_MAIN=1",
		"INBOX_STORE_URL=gatetest://?dir="+url.QueryEscape(dir), "INBOX_LISTEN_ADDR=127.0.0.1:0")
	lines := startLogging(t, cmd)
	var addr string
	for addr == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("inboxd exited before listening")
			}
			var rec struct{ Msg, Addr string }
			if json.Unmarshal([]byte(l), &rec) == nil && rec.Msg == "inboxd listening" {
				addr = rec.Addr
			}
		case <-time.After(20 * time.Second):
			t.Fatal("inboxd did not log its address")
		}
	}
	// SIGHUP reloads (nothing to reload here) and does not stop inboxd.
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for reloaded := false; !reloaded; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("inboxd exited on SIGHUP")
			}
			var rec struct{ Msg string }
			reloaded = json.Unmarshal([]byte(l), &rec) == nil && rec.Msg == "inboxd reloaded"
		case <-time.After(20 * time.Second):
			t.Fatal("inboxd did not log a reload after SIGHUP")
		}
	}
	answer := slowTryBegin(addr)
	waitFile(t, filepath.Join(dir, "entered"))
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitRefused(t, addr)
	if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if a := <-answer; a != "200 Acquired" {
		t.Fatalf("request in flight during SIGTERM got %q, want 200 Acquired", a)
	}
	var rest []string
	for l := range lines {
		rest = append(rest, l)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("inboxd exit after SIGTERM: %v; logs:\n%s", err, strings.Join(rest, "\n"))
	}
	if !strings.Contains(strings.Join(rest, "\n"), `"msg":"inboxd stopped"`) {
		t.Fatalf("no clean stop logged:\n%s", strings.Join(rest, "\n"))
	}
}

func TestRun_bearer_token_from_file_never_logged(t *testing.T) {
	t.Parallel()
	const token = "s3cr3t-token-value"
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, logs, stop, result := startRun(t, map[string]string{
		"INBOX_TOKEN_FILE": file, "INBOX_LISTEN_ADDR": "127.0.0.1:0", "INBOX_LOG_LEVEL": "debug",
		"INBOX_LEASE_MIN": "1s",
	})
	ctx := context.Background()
	good, err := stores.Open(ctx, "http://"+addr+"/?token_file="+url.QueryEscape(file))
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	c, err := good.TryBegin(ctx, "k", inbox.BeginOptions{Lease: time.Second})
	if err != nil || c.Status != inbox.Acquired || c.Lease != time.Second {
		t.Fatalf("TryBegin with the right token: %+v, %v", c, err)
	}
	bad, err := remote.New(remote.Options{URL: "http://" + addr, Token: "wrong-" + token})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	_, err = bad.TryBegin(ctx, "k2", inbox.BeginOptions{})
	if !errors.Is(err, remote.ErrUnauthorized) || !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Fatalf("TryBegin with a wrong token: %v, want ErrUnauthorized and ErrStoreUnavailable", err)
	}
	if strings.Contains(err.Error(), token) {
		t.Fatalf("error quotes the token: %v", err)
	}
	stop()
	if err := <-result; err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), token) {
		t.Fatalf("logs hold the token:\n%s", logs)
	}
	if !strings.Contains(logs.String(), `"auth":"bearer"`) || !strings.Contains(logs.String(), "unauthorized request") {
		t.Fatalf("logs lack the auth mode or the refused request:\n%s", logs)
	}
}

// The store URL is logged at INFO on every start, redacted: no password,
// no secret-bearing parameter (MongoDB's AWS session token included).
func TestRun_logs_the_store_url_without_secrets(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-Aws-Value"
	// check=false: nothing is sent to the (closed) port, inboxd starts.
	storeURL := "mongodb://AKIDEXAMPLE:" + secret + "@127.0.0.1:1/app?authMechanism=MONGODB-AWS" +
		"&authMechanismProperties=AWS_SESSION_TOKEN:" + secret + "&check=false"
	_, logs, stop, result := startRun(t, map[string]string{"INBOX_STORE_URL": storeURL, "INBOX_LISTEN_ADDR": "127.0.0.1:0"})
	stop()
	if err := <-result; err != nil {
		t.Fatal(err)
	}
	var line map[string]any
	for _, l := range strings.Split(logs.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "inboxd listening" {
			line = rec
		}
	}
	if line == nil || line["level"] != "INFO" {
		t.Fatalf("no INFO line \"inboxd listening\" in:\n%s", logs)
	}
	store, _ := line["store"].(string)
	if !strings.Contains(store, "mongodb://AKIDEXAMPLE:xxxxx@127.0.0.1:1/app") || !strings.Contains(store, "authMechanismProperties=xxxxx") {
		t.Errorf("logged store %q: want the URL with its secrets masked", store)
	}
	if strings.Contains(logs.String(), secret) {
		t.Fatalf("the logs hold the secret:\n%s", logs)
	}
}

func TestRun_endpoints_health_ready_metrics(t *testing.T) {
	t.Parallel()
	addr, _, _, _ := startRun(t, map[string]string{"INBOX_LISTEN_ADDR": "127.0.0.1:0", "INBOX_STORE_URL": "memory://?retention=1h"})
	// In this order: /metrics lists the request counter once requests were
	// counted.
	for _, c := range []struct{ path, want string }{
		{"/healthz", `"OK"`}, {"/readyz", `"OK"`}, {"/v1/inbox", `"version":"v1"`}, {"/metrics", "inbox_server_requests_total"},
	} {
		path, want := c.path, c.want
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Errorf("GET %s = %d %s, want 200 with %s", path, resp.StatusCode, b, want)
		}
	}
}

// The fail and admin extensions through inboxd: a key made dead through
// the remote client; a client that does not read Dead is told Busy until
// the record expires, by the store URL's retention (1h here, not the 7-day
// default); the admin calls work over http://.
func TestRun_fail_and_admin_extensions(t *testing.T) {
	t.Parallel()
	addr, _, _, _ := startRun(t, map[string]string{"INBOX_LISTEN_ADDR": "127.0.0.1:0", "INBOX_STORE_URL": "memory://?retention=1h"})
	ctx := context.Background()
	s, err := remote.New(remote.Options{URL: "http://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d, err := s.Discover(ctx)
	if err != nil || !d.Has("fail") || !d.Has("admin") {
		t.Fatalf("discovery %+v, %v: want the fail and admin extensions", d, err)
	}
	c, err := s.TryBegin(ctx, "k", inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Acquired || c.Attempts != 1 {
		t.Fatalf("TryBegin = %+v, %v", c, err)
	}
	if err := s.Fail(ctx, "k", c.LeaseID, inbox.FailOptions{Dead: true, Reason: "poison"}); err != nil {
		t.Fatal(err)
	}
	if c, err := s.TryBegin(ctx, "k", inbox.BeginOptions{}); err != nil || c.Status != inbox.Dead || c.Reason != "poison" {
		t.Fatalf("TryBegin of the dead key = %+v, %v; want Dead with the reason", c, err)
	}
	resp, err := http.Post("http://"+addr+"/v1/inbox/try-begin", "application/json", strings.NewReader(`{"key":"k"}`))
	if err != nil {
		t.Fatal(err)
	}
	var busy struct {
		Status       string
		RetryAfterMs int64
	}
	err = json.NewDecoder(resp.Body).Decode(&busy)
	resp.Body.Close()
	if left := time.Duration(busy.RetryAfterMs) * time.Millisecond; err != nil || busy.Status != "Busy" || left <= 59*time.Minute || left > time.Hour {
		t.Fatalf("try-begin of a dead key without acceptDead = %+v, %v; want Busy for the hour of the store URL's retention", busy, err)
	}
	p, err := s.List(ctx, inbox.ListOptions{State: inbox.StateDead})
	if err != nil || len(p.Items) != 1 || p.Items[0].Key != "k" {
		t.Fatalf("List(Dead) = %+v, %v", p, err)
	}
	if err := s.Forget(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if c, err := s.TryBegin(ctx, "k", inbox.BeginOptions{}); err != nil || c.Status != inbox.Acquired || c.Attempts != 1 {
		t.Fatalf("TryBegin after Forget = %+v, %v; want a new record", c, err)
	}
	if err := s.ForceRelease(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Get(ctx, "k"); err != nil || r.State != inbox.StateAvailable {
		t.Fatalf("Get after ForceRelease = %+v, %v; want Available", r, err)
	}
}

func TestStoreRetention(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]time.Duration{
		"memory://?retention=1h": time.Hour, "redis://h:6379/0?prefix=x&retention=7d": 7 * 24 * time.Hour,
		"memory://": 0, "memory://?retention=soon": 0, "%zz": 0,
	} {
		if got := storeRetention(raw); got != want {
			t.Errorf("storeRetention(%q) = %s, want %s", raw, got, want)
		}
	}
}

func TestParse_errors_name_the_setting(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		args []string
		vars map[string]string
		want string
	}{
		"bad duration":    {nil, map[string]string{"INBOX_LEASE_MIN": "soon"}, "INBOX_LEASE_MIN"},
		"bad number":      {nil, map[string]string{"INBOX_MAX_BODY_BYTES": "lots"}, "INBOX_MAX_BODY_BYTES"},
		"token and file":  {nil, map[string]string{"INBOX_TOKEN": "a", "INBOX_TOKEN_FILE": "/x"}, "not both"},
		"missing file":    {nil, map[string]string{"INBOX_TOKEN_FILE": "/nonexistent/token"}, "token file"},
		"no-auth value":   {nil, map[string]string{"INBOX_ALLOW_NO_AUTH": "perhaps"}, "INBOX_ALLOW_NO_AUTH"},
		"open, no auth":   {nil, map[string]string{"INBOX_LISTEN_ADDR": ":8080"}, "INBOX_ALLOW_NO_AUTH=true"},
		"unknown flag":    {[]string{"-nope"}, nil, "nope"},
		"stray argument":  {[]string{"extra"}, nil, "unexpected arguments"},
		"flag over env":   {[]string{"-lease-min", "never"}, nil, "lease-min"},
		"shutdown length": {nil, map[string]string{"INBOX_SHUTDOWN_TIMEOUT": "0s"}, "shutdown timeout"},
		"cert only":       {nil, map[string]string{"INBOX_TLS_CERT_FILE": "/x.pem"}, "INBOX_TLS_KEY_FILE"},
		"missing cert":    {[]string{"-tls-cert", "/nonexistent/c.pem", "-tls-key", "/nonexistent/k.pem"}, nil, "/nonexistent/c.pem"},
	} {
		_, err := parse(c.args, env(c.vars))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one naming %q", name, err, c.want)
		}
	}
	s, err := parse([]string{"-listen", "127.0.0.1:9", "-lease-policy", "reject"}, env(map[string]string{"INBOX_LISTEN_ADDR": "0.0.0.0:1", "INBOX_LEASE_MAX": "60s"}))
	if err != nil || s.listen != "127.0.0.1:9" || s.policy != "reject" || s.leaseMax != time.Minute || s.storeURL != "memory://" {
		t.Fatalf("flags over env and defaults: %+v, %v", s, err)
	}
	ctx := context.Background()
	for vars, want := range map[string]string{
		"INBOX_STORE_URL=nosuch://":  "unknown URL scheme",
		"INBOX_LEASE_POLICY=maybe":   "LeasePolicy",
		"INBOX_LOG_LEVEL=loud":       "log level",
		"INBOX_LISTEN_ADDR=bad:addr": "listen tcp",
	} {
		k, v, _ := strings.Cut(vars, "=")
		err := run(ctx, nil, env(map[string]string{k: v, "INBOX_ALLOW_NO_AUTH": "true", "INBOX_ALLOWED_HOSTS": "inbox.internal"}), io.Discard, nil, nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("run with %s: %v, want an error naming %q", vars, err, want)
		}
	}
}

// inboxd over the shared Redis, opened by URL through stores/all.
func TestRun_over_redis(t *testing.T) {
	t.Parallel()
	raw := testenv.Redis.URL(t)
	prefix := "inboxtest:inboxd:" + inbox.NewLeaseID() + ":"
	addr, _, _, _ := startRun(t, map[string]string{
		"INBOX_LISTEN_ADDR": "127.0.0.1:0", "INBOX_STORE_URL": raw + "?prefix=" + url.QueryEscape(prefix) + "&retention=1h",
	})
	ctx := context.Background()
	s, err := stores.Open(ctx, "http://"+addr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := s.TryBegin(ctx, "k", inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin through inboxd over Redis: %+v, %v", c, err)
	}
	if err := s.Complete(ctx, "k", c.LeaseID); err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(mustRedisOptions(t, raw))
	defer rc.Close()
	n, err := rc.Exists(ctx, prefix+"k").Result()
	if err != nil || n != 1 {
		t.Fatalf("Redis key %q: exists=%d, %v; want the record there", prefix+"k", n, err)
	}
	_ = rc.Del(ctx, prefix+"k")
}

func mustRedisOptions(t *testing.T, raw string) *redis.Options {
	o, err := redis.ParseURL(raw)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// selfSigned makes a certificate for 127.0.0.1 in a new directory.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	return testenv.SelfSignedCert(t, t.TempDir())
}

func TestRun_tls_serves_https_to_the_remote_client(t *testing.T) {
	t.Parallel()
	certFile, keyFile, pool := selfSigned(t)
	const token = "tls-test-token-0001"
	addr, logs, _, _ := startRun(t, map[string]string{
		"INBOX_LISTEN_ADDR": "127.0.0.1:0", "INBOX_TLS_CERT_FILE": certFile, "INBOX_TLS_KEY_FILE": keyFile,
		"INBOX_TOKEN": token,
	})
	ctx := context.Background()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	s, err := remote.New(remote.Options{URL: "https://" + addr, Token: token, HTTPClient: client})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := s.TryBegin(ctx, "tls:k", inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin over https: %+v, %v", c, err)
	}
	if err := s.Complete(ctx, "tls:k", c.LeaseID); err != nil {
		t.Fatalf("Complete over https: %v", err)
	}
	if done, err := s.IsProcessed(ctx, "tls:k"); err != nil || !done {
		t.Fatalf("IsProcessed over https: %v, %v", done, err)
	}

	// Plain HTTP to the TLS port gets no inbox answer.
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatalf("plain HTTP to the TLS port answered 200: %s", b)
		}
	}
	// A client that does not trust the certificate is refused.
	untrusting, err := remote.New(remote.Options{URL: "https://" + addr, Token: token, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer untrusting.Close()
	if _, err := untrusting.TryBegin(ctx, "tls:k2", inbox.BeginOptions{}); !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Fatalf("TryBegin with an untrusted certificate: %v, want ErrStoreUnavailable", err)
	}
	if !strings.Contains(logs.String(), `"scheme":"https"`) {
		t.Fatalf("the start line does not say https:\n%s", logs)
	}
}

// TestRun_reload_rotates_tokens_and_certificate rotates a token without a
// refused request and renews the certificate, through reloads (SIGHUP in
// main), and checks that a reload that cannot load keeps what was there.
func TestRun_reload_rotates_tokens_and_certificate(t *testing.T) {
	t.Parallel()
	certFile, keyFile, poolA := selfSigned(t)
	tokenFile := filepath.Join(t.TempDir(), "tokens")
	write := func(file, text string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(tokenFile, "old-secret-token\n")
	reload := make(chan os.Signal, 1)
	addr, logs, _, _ := startRunReloadable(t, map[string]string{
		"INBOX_LISTEN_ADDR": "127.0.0.1:0", "INBOX_TLS_CERT_FILE": certFile, "INBOX_TLS_KEY_FILE": keyFile,
		"INBOX_TOKEN_FILE": tokenFile,
	}, reload)
	reloads := 0
	doReload := func(wantLine string) {
		t.Helper()
		reloads++
		reload <- syscall.SIGHUP
		testenv.Eventually(t, 10*time.Second, "reload logged", func() bool {
			return strings.Count(logs.String(), `"msg":"inboxd reloaded"`) == reloads
		})
		if !strings.Contains(logs.String(), wantLine) {
			t.Fatalf("reload %d: logs lack %s:\n%s", reloads, wantLine, logs)
		}
	}
	ctx := context.Background()
	works := func(pool *x509.CertPool, token string) error {
		client := &http.Client{Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true,
		}}
		s, err := remote.New(remote.Options{URL: "https://" + addr, Token: token, HTTPClient: client, Timeout: 5 * time.Second, Retries: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		_, err = s.IsProcessed(ctx, "reload:k")
		return err
	}
	if err := works(poolA, "old-secret-token"); err != nil {
		t.Fatalf("before any reload: %v", err)
	}

	// Rotation: old and new accepted, then only new.
	write(tokenFile, "old-secret-token\n  new-secret-token  \n\n")
	doReload(`"tokens":2`)
	for _, tok := range []string{"old-secret-token", "new-secret-token"} {
		if err := works(poolA, tok); err != nil {
			t.Fatalf("with both tokens in the file, %s refused: %v", tok, err)
		}
	}
	write(tokenFile, "new-secret-token\n")
	doReload(`"tokens":1`)
	if err := works(poolA, "old-secret-token"); !errors.Is(err, remote.ErrUnauthorized) {
		t.Fatalf("old token after it left the file: %v, want ErrUnauthorized", err)
	}

	// A renewed certificate serves the next handshakes.
	newCert, newKey, poolB := selfSigned(t)
	for src, dst := range map[string]string{newCert: certFile, newKey: keyFile} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		write(dst, string(b))
	}
	doReload(`"cert_not_after"`)
	if err := works(poolB, "new-secret-token"); err != nil {
		t.Fatalf("after the certificate reload, a client trusting the new one: %v", err)
	}
	if err := works(poolA, "new-secret-token"); err == nil {
		t.Fatal("after the certificate reload, the old certificate is still served")
	}

	// What does not load is kept as it was.
	write(tokenFile, "\n \n")
	write(certFile, "not a certificate")
	doReload(`"complete":false`)
	if err := works(poolB, "new-secret-token"); err != nil {
		t.Fatalf("after a failed reload, the previous token and certificate: %v", err)
	}
	if !strings.Contains(logs.String(), "tokens kept as they were") || !strings.Contains(logs.String(), "certificate kept as it was") {
		t.Fatalf("failed reload not logged as errors:\n%s", logs)
	}
	if strings.Contains(logs.String(), "secret-token") {
		t.Fatalf("logs hold a token:\n%s", logs)
	}
}

// A missing or empty token file says what goes in it and how to make one.
func TestParse_token_file_errors_say_how_to_make_one(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := filepath.Join(dir, "secrets", "inbox")
	_, err := parse(nil, env(map[string]string{"INBOX_TOKEN_FILE": missing}))
	if err == nil {
		t.Fatal("a missing token file was accepted")
	}
	t.Logf("missing: %v", err)
	for _, want := range []string{missing, "does not exist", "bearer tokens clients must send, one a line",
		"mkdir -p " + filepath.Dir(missing) + " && head -c 32 /dev/urandom | base64 > " + missing, "loopback"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	// The command in the error makes a file inboxd takes.
	if out, err := exec.Command("sh", "-ec", err.Error()[strings.Index(err.Error(), "mkdir -p"):strings.Index(err.Error(), ". Or leave")]).CombinedOutput(); err != nil {
		t.Fatalf("the error's command: %v\n%s", err, out)
	}
	s, err := parse(nil, env(map[string]string{"INBOX_TOKEN_FILE": missing}))
	if err != nil || len(s.grants) != 1 || len(s.grants[0].Token) < 32 {
		t.Fatalf("token file made by the error's command: %d tokens, %v", len(s.grants), err)
	}

	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = parse(nil, env(map[string]string{"INBOX_TOKEN_FILE": empty}))
	if err == nil || !strings.Contains(err.Error(), "holds no token") || !strings.Contains(err.Error(), "base64 > "+empty) {
		t.Fatalf("empty token file: %v", err)
	}
	t.Logf("empty: %v", err)
}

// Without a token, inboxd serves on loopback only, unless told otherwise.
func TestParse_no_auth_only_on_loopback(t *testing.T) {
	t.Parallel()
	for addr, ok := range map[string]bool{
		"127.0.0.1:8080": true, "127.0.0.2:1": true, "[::1]:8080": true, "localhost:8080": true, "LOCALHOST:0": true,
		":8080": false, "0.0.0.0:8080": false, "[::]:8080": false, "10.1.2.3:8080": false, "inbox.internal:8080": false,
	} {
		_, err := parse(nil, env(map[string]string{"INBOX_LISTEN_ADDR": addr}))
		if ok != (err == nil) {
			t.Errorf("listen %s without a token: %v; want allowed=%v", addr, err, ok)
		}
		if err != nil && (!strings.Contains(err.Error(), "not loopback") || !strings.Contains(err.Error(), "INBOX_TOKEN_FILE")) {
			t.Errorf("listen %s: error %q does not say why and what to do", addr, err)
		}
		if _, err := parse([]string{"-allow-no-auth", "-allowed-hosts", "inbox.internal"}, env(map[string]string{"INBOX_LISTEN_ADDR": addr})); err != nil {
			t.Errorf("listen %s with -allow-no-auth: %v", addr, err)
		}
		if _, err := parse(nil, env(map[string]string{"INBOX_LISTEN_ADDR": addr, "INBOX_ALLOW_NO_AUTH": "true", "INBOX_ALLOWED_HOSTS": "inbox.internal, 10.1.2.3"})); err != nil {
			t.Errorf("listen %s with INBOX_ALLOW_NO_AUTH=true: %v", addr, err)
		}
		// Without a token, a server answers loopback Hosts only: clients
		// on other machines need their names allowed.
		_, err = parse(nil, env(map[string]string{"INBOX_LISTEN_ADDR": addr, "INBOX_ALLOW_NO_AUTH": "true"}))
		if ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), "INBOX_ALLOWED_HOSTS")) {
			t.Errorf("listen %s with INBOX_ALLOW_NO_AUTH=true and no INBOX_ALLOWED_HOSTS: %v; want allowed=%v, else an error naming INBOX_ALLOWED_HOSTS", addr, err, ok)
		}
		if _, err := parse(nil, env(map[string]string{"INBOX_LISTEN_ADDR": addr, "INBOX_TOKEN": "consumer-token-t0k"})); err != nil {
			t.Errorf("listen %s with a token: %v", addr, err)
		}
	}
	_, err := parse(nil, env(map[string]string{"INBOX_LISTEN_ADDR": "0.0.0.0:8080"}))
	t.Logf("open, no auth: %v", err)
}

// JSON logs write durations as strings, whoever logs them (inboxd's own
// lines, the server's request lines).
func TestRun_logs_durations_as_strings(t *testing.T) {
	t.Parallel()
	addr, logs, stop, result := startRun(t, map[string]string{"INBOX_LISTEN_ADDR": "127.0.0.1:0", "INBOX_LOG_LEVEL": "debug"})
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	stop()
	if err := <-result; err != nil {
		t.Fatal(err)
	}
	seen := map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		for _, k := range []string{"lease_min", "lease_max", "lease_default", "timeout", "duration"} {
			if v, ok := rec[k]; ok {
				seen[k] = v
				if _, isString := v.(string); !isString {
					t.Errorf("%s in %q is %v, not a string", k, line, v)
				}
			}
		}
	}
	if seen["lease_min"] != "30s" || seen["lease_default"] != "30s" || seen["timeout"] != "30s" {
		t.Errorf("durations %v, want lease_min, lease_default and the shutdown timeout as \"30s\"", seen)
	}
	if d, _ := seen["duration"].(string); !strings.HasSuffix(d, "s") {
		t.Errorf("request duration %v, want a string like 1.5ms", seen["duration"])
	}
}

// startLogging starts cmd, killed when the test ends, and returns the lines
// of its standard error as they come (closed when it exits).
func startLogging(t *testing.T, cmd *exec.Cmd) <-chan string {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return lines
}

// inboxd -h lists every flag with its environment variable on standard
// output and exits 0, as inboxctl does; the defaults it shows are the
// built-in ones, never the environment's (INBOX_STORE_URL may hold a
// password). An unknown flag exits 2, naming it and -h.
func TestMain_help_lists_the_flags(t *testing.T) {
	t.Parallel()
	runMain := func(args ...string) (code int, stdout, stderr string) {
		t.Helper()
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), "INBOXD_TEST_RUN_MAIN=1", "INBOX_STORE_URL=redis://:hunter2-password@127.0.0.1:1/0")
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
	}
	for _, h := range []string{"-h", "-help", "--help"} {
		code, out, errOut := runMain(h)
		if code != 0 || errOut != "" {
			t.Fatalf("inboxd %s: exit %d, stderr %q, want 0 and nothing on stderr", h, code, errOut)
		}
		var s settings
		var hosts string
		flags(&s, &hosts).VisitAll(func(f *flag.Flag) {
			if !strings.Contains(out, "\n  -"+f.Name+" ") && !strings.Contains(out, "\n  -"+f.Name+"\n") {
				t.Errorf("inboxd %s does not list -%s:\n%s", h, f.Name, out)
			}
		})
		for _, want := range []string{"Usage: inboxd", "INBOX_STORE_URL", "INBOX_TOKEN ", "INBOX_LISTEN_ADDR", `(default "memory://")`} {
			if !strings.Contains(out, want) {
				t.Errorf("inboxd %s lacks %q:\n%s", h, want, out)
			}
		}
		if strings.Contains(out, "hunter2") {
			t.Errorf("inboxd %s shows the environment's store URL:\n%s", h, out)
		}
	}
	code, out, errOut := runMain("-nope")
	if code != 2 || out != "" || !strings.Contains(errOut, "-nope") || !strings.Contains(errOut, "-h") {
		t.Fatalf("inboxd -nope: exit %d, stdout %q, stderr %q; want 2 and an error naming -nope and -h", code, out, errOut)
	}
}
