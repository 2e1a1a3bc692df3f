package remote_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/faultproxy"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores/remote"
	"github.com/watermill-inbox/inbox/stores/remote/server"
)

// injector sits in front of inboxd's handler: a fault function, when set,
// answers a request instead of (or after) the real server.
type injector struct {
	next  http.Handler
	fault atomic.Pointer[func(w http.ResponseWriter, r *http.Request, next http.Handler) bool]

	mu    sync.Mutex
	calls map[string]int // requests per path
}

func (in *injector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	in.mu.Lock()
	if in.calls == nil {
		in.calls = make(map[string]int)
	}
	in.calls[r.URL.EscapedPath()]++
	in.mu.Unlock()
	if f := in.fault.Load(); f != nil && (*f)(w, r, in.next) {
		return
	}
	in.next.ServeHTTP(w, r)
}

// on sets a fault for the requests to path ("" for every path); nil clears.
func (in *injector) on(path string, f func(w http.ResponseWriter, r *http.Request, next http.Handler)) {
	if f == nil {
		in.fault.Store(nil)
		return
	}
	g := func(w http.ResponseWriter, r *http.Request, next http.Handler) bool {
		if path != "" && r.URL.EscapedPath() != path {
			return false
		}
		f(w, r, next)
		return true
	}
	in.fault.Store(&g)
}

func (in *injector) count(path string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.calls[path]
}

// total is the number of requests to any path.
func (in *injector) total() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	n := 0
	for _, c := range in.calls {
		n += c
	}
	return n
}

// rig is a client in front of a faulty inboxd over a memory store that tests
// read directly.
type rig struct {
	backing inbox.LeaseStore
	in      *injector
	base    string
	client  *remote.Store
}

const testToken = "tok-3a9f-very-secret"

func newRig(t *testing.T, opts remote.Options) *rig {
	t.Helper()
	backing := newMemory(t, 0)
	// The rig's client holds an admin token, accepted everywhere, so that
	// it can make the admin calls too; consumers have a token of their own.
	// Tests send wrong tokens by the hundred: the server does not limit
	// failed authentications (the server's tests check that it can).
	h, err := server.New(server.Config{Store: backing, LeaseMin: time.Second, Token: "consumer-" + testToken, AdminTokens: []string{testToken},
		AuthFailuresPerMinute: -1})
	if err != nil {
		t.Fatal(err)
	}
	in := &injector{next: h}
	base := serveHandler(t, in)
	if opts.URL == "" {
		opts.URL = base
	}
	if opts.Token == "" {
		opts.Token = testToken
	}
	if opts.Timeout == 0 {
		opts.Timeout = 500 * time.Millisecond
	}
	return &rig{backing: backing, in: in, base: base, client: newClient(t, opts)}
}

func status(code int, body string) func(http.ResponseWriter, *http.Request, http.Handler) {
	return func(w http.ResponseWriter, _ *http.Request, _ http.Handler) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, body)
	}
}

// checkErr asserts err wraps every target, names the endpoint and never
// quotes the token.
func checkErr(t *testing.T, what string, err error, endpoint string, targets ...error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error", what)
	}
	for _, target := range targets {
		if !errors.Is(err, target) {
			t.Errorf("%s: error %q does not wrap %v", what, err, target)
		}
	}
	if !strings.Contains(err.Error(), endpoint) {
		t.Errorf("%s: error %q does not name %s", what, err, endpoint)
	}
	if strings.Contains(err.Error(), testToken) {
		t.Errorf("%s: error quotes the token: %q", what, err)
	}
}

// allCalls runs every store call on key and returns their errors by name.
func allCalls(s *remote.Store, key string) map[string]error {
	ctx := context.Background()
	out := map[string]error{}
	_, out["TryBegin"] = s.TryBegin(ctx, key, inbox.BeginOptions{})
	out["Complete"] = s.Complete(ctx, key, "lease-1")
	out["Release"] = s.Release(ctx, key, "lease-1")
	_, out["Extend"] = s.Extend(ctx, key, "lease-1", time.Second)
	_, out["Get"] = s.Get(ctx, key)
	_, out["IsProcessed"] = s.IsProcessed(ctx, key)
	out["MarkProcessed"] = s.MarkProcessed(ctx, key)
	return out
}

// nothingStored asserts the backing store never heard of key.
func nothingStored(t *testing.T, backing inbox.LeaseStore, key string) {
	t.Helper()
	r, err := backing.Get(context.Background(), key)
	if err != nil || r.State != inbox.StateNotFound {
		t.Fatalf("backing store holds %q: %+v, %v; want nothing", key, r, err)
	}
}

func TestFaults_server_down(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	px := faultproxy.New(t, strings.TrimPrefix(r.base, "http://"))
	px.Cut()
	c := newClient(t, remote.Options{URL: "http://" + px.Addr(), Token: testToken, Timeout: 500 * time.Millisecond})
	remote.SetDiscoveryRetry(c, 100*time.Millisecond)
	for name, err := range allCalls(c, "down-key") {
		checkErr(t, name, err, "/v1/inbox", inbox.ErrStoreUnavailable)
	}
	px.Restore()
	// The same client recovers once its failed discovery is asked again.
	testenv.Eventually(t, 10*time.Second, "TryBegin through the restored link", func() bool {
		c, err := c.TryBegin(context.Background(), "down-key", inbox.BeginOptions{})
		return err == nil && c.Status == inbox.Acquired
	})
}

func TestFaults_slower_than_the_timeout(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{Timeout: 200 * time.Millisecond, Retries: 1})
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	r.in.on("", func(w http.ResponseWriter, req *http.Request, next http.Handler) {
		select {
		case <-release:
		case <-req.Context().Done():
		}
	})
	start := time.Now()
	_, err := r.client.TryBegin(context.Background(), "slow-key", inbox.BeginOptions{})
	checkErr(t, "TryBegin against a stalled server", err, "GET /v1/inbox", inbox.ErrStoreUnavailable)
	if !strings.Contains(err.Error(), "no answer within 200ms") {
		t.Fatalf("error %q does not say it timed out", err)
	}
	if el := time.Since(start); el < 400*time.Millisecond {
		t.Fatalf("gave up after %s: two attempts of 200ms each were due", el)
	}
	// Stalled TCP (faultproxy) instead of a stalled handler.
	px := faultproxy.New(t, strings.TrimPrefix(r.base, "http://"))
	px.Stall()
	c := newClient(t, remote.Options{URL: "http://" + px.Addr(), Token: testToken, Timeout: 200 * time.Millisecond, Retries: -1})
	err = c.Complete(context.Background(), "k", "lease")
	checkErr(t, "Complete over a stalled link", err, "POST /v1/inbox/mark-processed", inbox.ErrStoreUnavailable)
	// The caller's deadline bounds the whole call.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = c.Complete(ctx, "k", "lease")
	checkErr(t, "Complete with a short caller deadline", err, "mark-processed", inbox.ErrStoreUnavailable, context.DeadlineExceeded)
	nothingStored(t, r.backing, "slow-key")
}

func TestFaults_500s_are_retried_then_fail(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{Retries: 2})
	mustBegin(t, r.client, "warm", inbox.Acquired) // discovery read
	r.in.on("/v1/inbox/try-begin", status(500, `{"error":"internal_error","message":"the store failed"}`))
	_, err := r.client.TryBegin(context.Background(), "k500", inbox.BeginOptions{})
	checkErr(t, "TryBegin answered 500", err, "POST /v1/inbox/try-begin", inbox.ErrStoreUnavailable)
	if !strings.Contains(err.Error(), "gave up after 3 attempts") || r.in.count("/v1/inbox/try-begin") != 4 {
		t.Fatalf("error %q after %d try-begin requests; want 3 attempts (plus the warm-up)", err, r.in.count("/v1/inbox/try-begin"))
	}
	nothingStored(t, r.backing, "k500")

	// 4xx other than 408 and 429 are never retried.
	r.in.on("/v1/inbox/mark-processed", status(409, `{"error":"conflict","message":"no"}`))
	err = r.client.Complete(context.Background(), "k", "l")
	checkErr(t, "Complete answered 409", err, "mark-processed", inbox.ErrStoreUnavailable, remote.ErrProtocol)
	if n := r.in.count("/v1/inbox/mark-processed"); n != 1 {
		t.Fatalf("a 409 was sent %d times, want once", n)
	}
	// 429 is, honouring Retry-After.
	var n atomic.Int32
	r.in.on("/v1/inbox/release", func(w http.ResponseWriter, req *http.Request, next http.Handler) {
		if n.Add(1) == 1 {
			w.Header().Set("Retry-After", "1")
			status(429, `{"error":"slow_down","message":"later"}`)(w, req, next)
			return
		}
		next.ServeHTTP(w, req)
	})
	c := mustBegin(t, r.client, "k429", inbox.Acquired)
	start := time.Now()
	if err := r.client.Release(context.Background(), "k429", c.LeaseID); err != nil {
		t.Fatalf("Release after one 429: %v", err)
	}
	if el := time.Since(start); el < time.Second {
		t.Fatalf("retried after %s, before the Retry-After of 1s", el)
	}
}

func TestFaults_malformed_answers(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{MaxResponseBytes: 2048})
	mustBegin(t, r.client, "warm", inbox.Acquired)
	for what, f := range map[string]func(http.ResponseWriter, *http.Request, http.Handler){
		"malformed JSON":     status(200, `{"status": "Acquired"`),
		"HTML":               status(200, `<html>hello</html>`),
		"unknown status":     status(200, `{"status":"Maybe"}`),
		"Acquired no lease":  status(200, `{"status":"Acquired","expiresAt":"2030-01-01T00:00:00Z"}`),
		"Acquired no expiry": status(200, `{"status":"Acquired","leaseId":"x"}`),
		"Busy no expiry":     status(200, `{"status":"Busy"}`),
		"oversize":           status(200, `{"status":"Processed","pad":"`+strings.Repeat("x", 4096)+`"}`),
		"redirect": func(w http.ResponseWriter, r *http.Request, _ http.Handler) {
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		},
		"teapot": status(418, `short and stout`),
	} {
		r.in.on("/v1/inbox/try-begin", f)
		_, err := r.client.TryBegin(context.Background(), "mal-"+what, inbox.BeginOptions{})
		checkErr(t, what, err, "POST /v1/inbox/try-begin", inbox.ErrStoreUnavailable, remote.ErrProtocol)
		if what == "unknown status" && !strings.Contains(err.Error(), `"Maybe"`) {
			t.Errorf("error %q does not name the unknown status", err)
		}
	}
	r.in.on("/v1/inbox/mark-processed", status(200, `{"status":"Released"}`))
	err := r.client.Complete(context.Background(), "k", "l")
	checkErr(t, "status of another endpoint", err, "mark-processed", inbox.ErrStoreUnavailable, remote.ErrProtocol)
	r.in.on("", status(200, `{"status":"Gone","attempts":1}`))
	_, err = r.client.Get(context.Background(), "k")
	checkErr(t, "Get with an unknown state", err, "GET /v1/inbox/{key}", inbox.ErrStoreUnavailable, remote.ErrProtocol)
	r.in.on("", nil)
	if r.in.count("/v1/inbox/try-begin") != 10 {
		t.Fatalf("%d try-begin requests: malformed answers must not be retried", r.in.count("/v1/inbox/try-begin"))
	}
}

func TestFaults_wrong_token(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	for _, tok := range []string{"wrong-token", ""} {
		var c *remote.Store
		if tok == "" {
			c = newClient(t, remote.Options{URL: r.base})
		} else {
			c = newClient(t, remote.Options{URL: r.base, Token: tok})
		}
		for name, err := range allCalls(c, "tok-key") {
			checkErr(t, name+" with token "+tok, err, "/v1/inbox", inbox.ErrStoreUnavailable, remote.ErrUnauthorized)
			if strings.Contains(err.Error(), tok) && tok != "" {
				t.Errorf("error quotes the client's token: %v", err)
			}
		}
	}
	nothingStored(t, r.backing, "tok-key")
}

func TestFaults_wrong_base_path(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	c := newClient(t, remote.Options{URL: r.base + "/wrong/prefix", Token: testToken})
	for name, err := range allCalls(c, "base-key") {
		want := []error{inbox.ErrStoreUnavailable, remote.ErrEndpointNotFound}
		if name == "Extend" {
			want = []error{inbox.ErrNotSupported} // no discovery: no extension
		}
		checkErr(t, name, err, "/v1/inbox", want...)
	}
	nothingStored(t, r.backing, "base-key")
}

// A server that answers 404 for unknown keys: NotFound only once its
// discovery document was read.
func TestFaults_404_on_get(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	r.in.on("/v1/inbox/k404", status(404, `{"error":"not_found","message":"unknown key"}`))
	if rec, err := r.client.Get(context.Background(), "k404"); err != nil || rec.State != inbox.StateNotFound {
		t.Fatalf("404 from a server with discovery: %+v, %v; want NotFound", rec, err)
	}
	legacy := newRig(t, remote.Options{})
	legacy.in.on("", func(w http.ResponseWriter, req *http.Request, next http.Handler) {
		if req.URL.Path == "/v1/inbox" || req.URL.Path == "/v1/inbox/k404" {
			status(404, `{}`)(w, req, next)
			return
		}
		next.ServeHTTP(w, req)
	})
	_, err := legacy.client.Get(context.Background(), "k404")
	checkErr(t, "404 from a server without discovery", err, "GET /v1/inbox/{key}", inbox.ErrStoreUnavailable, remote.ErrEndpointNotFound)
	if _, err := legacy.client.Extend(context.Background(), "k", "l", time.Second); !errors.Is(err, inbox.ErrNotSupported) {
		t.Fatalf("Extend without discovery: %v, want ErrNotSupported", err)
	}
	if d, err := legacy.client.Discover(context.Background()); d != nil || err != nil {
		t.Fatalf("Discover without a document = %v, %v; want nil, nil", d, err)
	}
}

// strip removes ext. fields from every answer and "extend" from discovery: an
// older server.
func strip(fields ...string) func(http.ResponseWriter, *http.Request, http.Handler) {
	return stripExt([]string{"extend"}, fields...)
}

// stripExt removes the extensions exts from discovery and fields from every
// answer.
func stripExt(exts []string, fields ...string) func(http.ResponseWriter, *http.Request, http.Handler) {
	return func(w http.ResponseWriter, req *http.Request, next http.Handler) {
		rec := &capture{header: http.Header{}}
		next.ServeHTTP(rec, req)
		var m map[string]any
		if json.Unmarshal(rec.body.Bytes(), &m) == nil {
			for _, f := range fields {
				delete(m, f)
			}
			if list, ok := m["extensions"].([]any); ok {
				var keep []any
				for _, e := range list {
					if !slices.Contains(exts, e.(string)) {
						keep = append(keep, e)
					}
				}
				m["extensions"] = keep
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.code)
		_ = json.NewEncoder(w).Encode(m)
	}
}

type capture struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (c *capture) Header() http.Header { return c.header }
func (c *capture) Write(b []byte) (int, error) {
	if c.code == 0 {
		c.code = http.StatusOK
	}
	return c.body.Write(b)
}
func (c *capture) WriteHeader(code int) { c.code = code }

func TestClient_works_without_extension_fields(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	r.in.on("", strip("leaseSeconds", "retryAfterMs", "payloadMismatch", "payloadHash"))
	ctx := context.Background()
	c, err := r.client.TryBegin(ctx, "k", inbox.BeginOptions{Lease: 5 * time.Second, PayloadHash: "h1"})
	if err != nil || c.Status != inbox.Acquired || c.Lease != 5*time.Second {
		t.Fatalf("Acquired without leaseSeconds: %+v, %v; want the lease asked for", c, err)
	}
	b, err := r.client.TryBegin(ctx, "k", inbox.BeginOptions{PayloadHash: "h2"})
	if err != nil || b.Status != inbox.Busy || b.RetryAfter <= 3*time.Second || b.RetryAfter > 5*time.Second || b.PayloadMismatch {
		t.Fatalf("Busy without retryAfterMs: %+v, %v; want RetryAfter from expiresAt and no mismatch", b, err)
	}
	if _, err := r.client.Extend(ctx, "k", c.LeaseID, 5*time.Second); !errors.Is(err, inbox.ErrNotSupported) {
		t.Fatalf("Extend on a server that does not list it: %v, want ErrNotSupported", err)
	}
	if r.in.count("/v1/inbox/extend") != 0 {
		t.Fatal("Extend was sent to a server that does not list it")
	}
	if err := r.client.Complete(ctx, "k", c.LeaseID); err != nil {
		t.Fatal(err)
	}
}

// A retried try-begin whose first answer was lost gets Acquired again, with
// one attempt counted; a retried release whose first answer was lost
// returns nil.
func TestClient_retries_after_lost_answers_are_safe(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	ctx := context.Background()
	mustBegin(t, r.client, "warm", inbox.Acquired)
	lose := func(path string) {
		var n atomic.Int32
		r.in.on(path, func(w http.ResponseWriter, req *http.Request, next http.Handler) {
			if n.Add(1) == 1 {
				next.ServeHTTP(&capture{header: http.Header{}}, req) // the server acts...
				hj, _ := w.(http.Hijacker)
				conn, _, _ := hj.Hijack()
				_ = conn.(*net.TCPConn).SetLinger(0)
				_ = conn.Close() // ...and the answer is lost
				return
			}
			next.ServeHTTP(w, req)
		})
	}
	lose("/v1/inbox/try-begin")
	c, err := r.client.TryBegin(ctx, "lost", inbox.BeginOptions{Lease: 30 * time.Second})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin whose first answer was lost: %+v, %v; want Acquired", c, err)
	}
	if rec, _ := r.backing.Get(ctx, "lost"); rec.Attempts != 1 || rec.State != inbox.StateInProgress {
		t.Fatalf("record after the retried TryBegin: %+v; want InProgress with 1 attempt", rec)
	}
	lose("/v1/inbox/release")
	if err := r.client.Release(ctx, "lost", c.LeaseID); err != nil {
		t.Fatalf("Release whose first answer was lost: %v; want nil (the lease is gone either way)", err)
	}
	if rec, _ := r.backing.Get(ctx, "lost"); rec.State != inbox.StateAvailable {
		t.Fatalf("after Release: %v, want Available", rec.State)
	}
	r.in.on("", nil)
	if err := r.client.Release(ctx, "lost", c.LeaseID); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Fatalf("a second Release call: %v, want ErrLeaseLost", err)
	}
	c2 := mustBegin(t, r.client, "lost", inbox.Acquired)
	lose("/v1/inbox/mark-processed")
	if err := r.client.Complete(ctx, "lost", c2.LeaseID); err != nil {
		t.Fatalf("Complete whose first answer was lost: %v", err)
	}
	if rec, _ := r.backing.Get(ctx, "lost"); rec.State != inbox.StateProcessed || rec.Attempts != 2 {
		t.Fatalf("after Complete: %+v", rec)
	}
}

func TestClient_canceled_context(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	r.in.on("/v1/inbox/try-begin", func(w http.ResponseWriter, req *http.Request, next http.Handler) {
		_, _ = io.Copy(io.Discard, req.Body) // so the server notices the client leaving
		cancel()
		<-req.Context().Done()
	})
	_, err := r.client.TryBegin(ctx, "k", inbox.BeginOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("TryBegin canceled in flight: %v, want context.Canceled", err)
	}
}

func TestClient_sends_keys_escaped(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	var got []string
	var mu sync.Mutex
	r.in.on("", func(w http.ResponseWriter, req *http.Request, next http.Handler) {
		mu.Lock()
		got = append(got, req.RequestURI)
		mu.Unlock()
		next.ServeHTTP(w, req)
	})
	for _, key := range []string{"..", "a/./b", "%2e", "?x#y", "é"} {
		if _, err := r.client.Get(context.Background(), key); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"/v1/inbox", "/v1/inbox/%2E%2E?acceptDead=true", "/v1/inbox/a%2F%2E%2Fb?acceptDead=true", "/v1/inbox/%252e?acceptDead=true",
		"/v1/inbox/%3Fx%23y?acceptDead=true", "/v1/inbox/%C3%A9?acceptDead=true"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("request URIs\n got %q\nwant %q", got, want)
	}
}

// Against a server that does not honour the caller's leaseId, a try-begin is
// not safe to repeat: it gets exactly one attempt.
func TestClient_try_begin_not_retried_without_the_leaseId_extension(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{Retries: 3})
	strip := stripExt([]string{"leaseId"})
	r.in.on("", func(w http.ResponseWriter, req *http.Request, next http.Handler) {
		if req.URL.Path == "/v1/inbox/try-begin" {
			status(503, `{"error":"store_unavailable","message":"x"}`)(w, req, next)
			return
		}
		strip(w, req, next)
	})
	_, err := r.client.TryBegin(context.Background(), "k", inbox.BeginOptions{})
	checkErr(t, "TryBegin answered 503", err, "try-begin", inbox.ErrStoreUnavailable)
	if n := r.in.count("/v1/inbox/try-begin"); n != 1 {
		t.Fatalf("try-begin sent %d times to a server without the leaseId extension, want once", n)
	}
	if err := r.client.Complete(context.Background(), "k", "l"); err == nil {
		t.Fatal("Complete of an unknown lease succeeded")
	}
	_ = r.client.Release(context.Background(), "k", "l")
	r.in.on("/v1/inbox/release", status(503, `{"error":"store_unavailable","message":"x"}`))
	_ = r.client.Release(context.Background(), "k", "l")
	if n := r.in.count("/v1/inbox/release"); n != 1+4 {
		t.Fatalf("release sent %d times, want 1 and then 4 (it carries its leaseId, so it is retried)", n)
	}
}

// tooMany answers the first n requests 429 with Retry-After sec and the
// error code, then lets requests through.
func tooMany(n int, sec, code string) func(http.ResponseWriter, *http.Request, http.Handler) {
	var seen atomic.Int32
	return func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		if int(seen.Add(1)) > n {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Retry-After", sec)
		status(http.StatusTooManyRequests, `{"error":"`+code+`","message":"over a limit"}`)(w, r, next)
	}
}

// A 429 (a limit of the service: request rate, live records, failed
// authentications) is a refusal: nothing was done, so every call may be
// repeated after it, forget included. The client waits what Retry-After
// says, when that is within its own bound (5 s), for at most Retries more
// attempts; a longer Retry-After fails at once, without a request more.
// Either way the error wraps ErrTooManyRequests and
// inbox.ErrStoreUnavailable: the middleware nacks and backs off, with no
// hot loop.
func TestClient_429_is_a_bounded_retry(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)

	r := newRig(t, remote.Options{Retries: 2})
	r.in.on("/v1/inbox/try-begin", tooMany(2, "1", "rate_limited"))
	start := time.Now()
	c, err := r.client.TryBegin(ctx, "k", inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin after two 429s with Retry-After 1: %+v, %v", c, err)
	}
	if el := time.Since(start); el < 2*time.Second || r.in.count("/v1/inbox/try-begin") != 3 {
		t.Fatalf("TryBegin took %s and %d requests, want 3 requests at least 1 s apart (Retry-After)", el, r.in.count("/v1/inbox/try-begin"))
	}

	r = newRig(t, remote.Options{Retries: 2})
	r.in.on("/v1/inbox/forget", tooMany(1, "1", "rate_limited"))
	if err := r.client.Forget(ctx, "k"); err != nil || r.in.count("/v1/inbox/forget") != 2 {
		t.Fatalf("Forget after a 429: %v after %d requests, want success after 2", err, r.in.count("/v1/inbox/forget"))
	}

	r = newRig(t, remote.Options{Retries: 2})
	r.in.on("/v1/inbox/try-begin", tooMany(1000, "691200", "quota_exceeded"))
	_, err = r.client.TryBegin(ctx, "k", inbox.BeginOptions{})
	checkErr(t, "TryBegin refused for 8 days", err, "/v1/inbox/try-begin", remote.ErrTooManyRequests, inbox.ErrStoreUnavailable)
	if n := r.in.count("/v1/inbox/try-begin"); n != 1 || !strings.Contains(err.Error(), "quota_exceeded") || !strings.Contains(err.Error(), "Retry-After 192h0m0s") {
		t.Fatalf("a 429 with Retry-After 8 days: %d requests, error %v; want one request (no wait, no retry), the code and the wait quoted", n, err)
	}

	r = newRig(t, remote.Options{Retries: 1})
	r.in.on("/v1/inbox/mark-processed", tooMany(1000, "1", "rate_limited"))
	err = r.client.MarkProcessed(ctx, "k")
	checkErr(t, "MarkProcessed always refused", err, "/v1/inbox/mark-processed", remote.ErrTooManyRequests, inbox.ErrStoreUnavailable)
	if n := r.in.count("/v1/inbox/mark-processed"); n != 2 {
		t.Fatalf("MarkProcessed always answered 429: %d requests, want 2 (Retries 1)", n)
	}
}
