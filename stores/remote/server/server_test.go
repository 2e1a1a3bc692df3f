package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/memory"
	"github.com/watermill-inbox/inbox/stores/remote/server"
)

func newMemory(t testing.TB) *memory.Store {
	t.Helper()
	m, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func newServer(t testing.TB, cfg server.Config) *server.Server {
	t.Helper()
	if cfg.Store == nil {
		cfg.Store = newMemory(t)
	}
	h, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// call sends one request to h in process and returns code and decoded body.
// The request's Host is 127.0.0.1:8080, and a body is application/json,
// unless hdr (name, value, ...) names them ("Host" sets the Host,
// "RemoteAddr" the client's address, 192.0.2.1:1234 otherwise).
func call(t testing.TB, h http.Handler, method, target, body string, hdr ...string) (int, map[string]any, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, rd)
	// As a client of a server on loopback sends, unless hdr says otherwise.
	req.Host = "127.0.0.1:8080"
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		if hdr[i] == "RemoteAddr" {
			req.RemoteAddr = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var m map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil && method != http.MethodHead {
		t.Fatalf("%s %s: answer %d is not a JSON object: %q", method, target, rec.Code, rec.Body.String())
	}
	return rec.Code, m, rec.Header()
}

func want(t testing.TB, what string, code int, body map[string]any, wantCode int, field, value string) {
	t.Helper()
	if code != wantCode || fmt.Sprint(body[field]) != value {
		t.Fatalf("%s: %d %v, want %d with %s=%s", what, code, body, wantCode, field, value)
	}
}

func TestServer_try_begin_lifecycle(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{LeaseMin: time.Second})
	code, b, _ := call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k","owner":"o","leaseSeconds":5,"leaseId":"L1","payloadHash":"h1"}`)
	want(t, "first try-begin", code, b, 200, "status", "Acquired")
	if b["leaseId"] != "L1" || b["leaseSeconds"] != 5.0 || b["expiresAt"] == nil {
		t.Fatalf("Acquired answer %v lacks leaseId L1, leaseSeconds 5 or expiresAt", b)
	}
	if _, err := time.Parse(time.RFC3339Nano, b["expiresAt"].(string)); err != nil || !strings.HasSuffix(b["expiresAt"].(string), "Z") {
		t.Fatalf("expiresAt %v is not RFC 3339 UTC: %v", b["expiresAt"], err)
	}
	code, b, _ = call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k","payloadHash":"h2"}`)
	want(t, "second try-begin", code, b, 200, "status", "Busy")
	if b["retryAfterMs"] == nil || b["expiresAt"] == nil || b["payloadMismatch"] != true || b["leaseId"] != nil {
		t.Fatalf("Busy answer %v: want retryAfterMs, expiresAt, payloadMismatch and no leaseId", b)
	}
	code, b, _ = call(t, h, "GET", "/v1/inbox/k", "")
	want(t, "get", code, b, 200, "status", "InProgress")
	if b["attempts"] != 1.0 || b["owner"] != "o" || b["payloadHash"] != "h1" || b["leaseUntil"] == nil || b["firstSeen"] == nil || b["lastSeen"] == nil {
		t.Fatalf("record %v", b)
	}
	code, b, _ = call(t, h, "POST", "/v1/inbox/extend", `{"key":"k","leaseId":"L1","leaseSeconds":9}`)
	want(t, "extend", code, b, 200, "status", "Extended")
	if b["expiresAt"] == nil || b["leaseSeconds"] != 9.0 {
		t.Fatalf("Extended answer %v", b)
	}
	code, b, _ = call(t, h, "POST", "/v1/inbox/extend", `{"key":"k","leaseId":"other"}`)
	want(t, "foreign extend", code, b, 200, "status", "LeaseLost")
	code, b, _ = call(t, h, "POST", "/v1/inbox/release", `{"key":"k","leaseId":"other"}`)
	want(t, "foreign release", code, b, 200, "status", "LeaseLost")
	code, b, _ = call(t, h, "POST", "/v1/inbox/mark-processed", `{"key":"k","leaseId":"L1"}`)
	want(t, "mark", code, b, 200, "status", "Processed")
	code, b, _ = call(t, h, "POST", "/v1/inbox/mark-processed", `{"key":"k","leaseId":"L1"}`)
	want(t, "mark repeated by the completing lease", code, b, 200, "status", "Processed")
	code, b, _ = call(t, h, "POST", "/v1/inbox/release", `{"key":"k","leaseId":"L1"}`)
	want(t, "release after mark", code, b, 200, "status", "LeaseLost")
	code, b, _ = call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k"}`)
	want(t, "try-begin after mark", code, b, 200, "status", "Processed")
	if len(b) != 2 || b["attempts"] != 1.0 {
		t.Fatalf("Processed answer %v, want its status and attempts 1 only", b)
	}
	code, b, _ = call(t, h, "GET", "/v1/inbox/never-seen", "")
	want(t, "unknown key", code, b, 200, "status", "NotFound")
	if b["attempts"] != 0.0 || len(b) != 2 {
		t.Fatalf("NotFound answer %v, want status and attempts 0 only", b)
	}
}

func TestServer_mark_processed_without_lease_id_is_the_unleased_mark(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{})
	call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"held"}`)
	code, b, _ := call(t, h, "POST", "/v1/inbox/mark-processed", `{"key":"held"}`)
	want(t, "unleased mark over a lease", code, b, 200, "status", "Processed")
	code, b, _ = call(t, h, "GET", "/v1/inbox/held", "")
	want(t, "get", code, b, 200, "status", "Processed")
	code, b, _ = call(t, h, "POST", "/v1/inbox/mark-processed", `{"key":"x","leaseId":""}`)
	want(t, "explicit empty leaseId", code, b, 400, "error", "invalid_lease_id")
	code, b, _ = call(t, h, "POST", "/v1/inbox/release", `{"key":"x"}`)
	want(t, "release without leaseId", code, b, 400, "error", "invalid_lease_id")
}

func TestServer_bad_input(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{MaxKeyBytes: 10})
	for _, c := range []struct{ path, body, code string }{
		{"try-begin", `not json`, "invalid_json"},
		{"try-begin", `[1,2]`, "invalid_json"},
		{"try-begin", `null`, "invalid_json"},
		{"try-begin", `{"key":"a"} {"key":"b"}`, "invalid_json"},
		{"try-begin", `{}`, "invalid_key"},
		{"try-begin", `{"key":""}`, "invalid_key"},
		{"try-begin", `{"key":12}`, "invalid_key"},
		{"try-begin", `{"key":"01234567890"}`, "invalid_key"},
		{"try-begin", `{"key":"a\u0000b"}`, "invalid_key"},
		{"try-begin", `{"KEY":"a"}`, "invalid_key"}, // names match exactly
		{"try-begin", `{"key":"a","leaseSeconds":0}`, "invalid_lease"},
		{"try-begin", `{"key":"a","leaseSeconds":-3}`, "invalid_lease"},
		{"try-begin", `{"key":"a","leaseSeconds":1.5}`, "invalid_lease"},
		{"try-begin", `{"key":"a","leaseSeconds":"30"}`, "invalid_lease"},
		{"try-begin", `{"key":"a","leaseId":""}`, "invalid_lease_id"},
		{"try-begin", `{"key":"a","leaseId":7}`, "invalid_lease_id"},
		{"try-begin", `{"key":"a","owner":"` + strings.Repeat("o", 300) + `"}`, "invalid_argument"},
		{"try-begin", `{"key":"a","payloadHash":true}`, "invalid_argument"},
		{"mark-processed", `{"leaseId":"x"}`, "invalid_key"},
		{"extend", `{"key":"a","leaseId":"x","leaseSeconds":0}`, "invalid_lease"},
		{"extend", `{"key":"a"}`, "invalid_lease_id"},
	} {
		code, b, _ := call(t, h, "POST", "/v1/inbox/"+c.path, c.body)
		if code != 400 || b["error"] != c.code || b["message"] == "" {
			t.Errorf("POST %s %s = %d %v, want 400 %s with a message", c.path, c.body, code, b, c.code)
		}
	}
	// Unknown fields are ignored; null is absent.
	code, b, _ := call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"a","future":{"x":1},"owner":null}`)
	want(t, "unknown fields", code, b, 200, "status", "Acquired")
	code, b, _ = call(t, h, "GET", "/v1/inbox/", "")
	want(t, "GET of the empty key", code, b, 400, "error", "invalid_key")
	code, b, _ = call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"`+strings.Repeat("k", 20<<10)+`"}`)
	want(t, "body over the limit", code, b, 413, "error", "body_too_large")
	code, b, _ = call(t, h, "POST", "/v2/inbox/try-begin", `{}`)
	want(t, "unknown path", code, b, 404, "error", "not_found")
	code, b, hdr := call(t, h, "DELETE", "/v1/inbox/k", "")
	want(t, "wrong method", code, b, 405, "error", "method_not_allowed")
	if hdr.Get("Allow") != "GET, HEAD" {
		t.Fatalf("405 without Allow: GET, HEAD: %v", hdr)
	}
	code, b, hdr = call(t, h, "PUT", "/v1/inbox/try-begin", `{"key":"k"}`)
	want(t, "PUT try-begin", code, b, 405, "error", "method_not_allowed")
	if hdr.Get("Allow") != "GET, HEAD, POST" || !strings.Contains(b["message"].(string), "use POST") {
		t.Fatalf("405 on an operation path: Allow %q, message %q", hdr.Get("Allow"), b["message"])
	}
	code, b, _ = call(t, h, "POST", "/v1/inbox", `{}`)
	want(t, "POST discovery", code, b, 405, "error", "method_not_allowed")
}

func TestServer_lease_policy(t *testing.T) {
	t.Parallel()
	clamp := newServer(t, server.Config{LeaseMin: 10 * time.Second, LeaseMax: 20 * time.Second, LeaseDefault: 15 * time.Second})
	for body, granted := range map[string]float64{
		`{"key":"a"}`:                          15,
		`{"key":"b","leaseSeconds":1}`:         10,
		`{"key":"c","leaseSeconds":12}`:        12,
		`{"key":"d","leaseSeconds":99999}`:     20,
		`{"key":"e","leaseSeconds":9.2e18}`:    20,
		`{"key":"f","leaseSeconds":922337203}`: 20,
	} {
		code, b, _ := call(t, clamp, "POST", "/v1/inbox/try-begin", body)
		if code != 200 || b["leaseSeconds"] != granted {
			t.Errorf("clamp %s = %d %v, want leaseSeconds %v", body, code, b, granted)
		}
	}
	reject := newServer(t, server.Config{LeaseMin: 10 * time.Second, LeaseMax: 20 * time.Second, LeaseDefault: 15 * time.Second, LeasePolicy: server.PolicyReject})
	for _, sec := range []int{9, 21} {
		code, b, _ := call(t, reject, "POST", "/v1/inbox/try-begin", fmt.Sprintf(`{"key":"k","leaseSeconds":%d}`, sec))
		want(t, fmt.Sprintf("reject %d s", sec), code, b, 400, "error", "invalid_lease")
		if !strings.Contains(b["message"].(string), "[10, 20]") {
			t.Errorf("message %q does not state the range", b["message"])
		}
	}
	code, b, _ := call(t, reject, "GET", "/v1/inbox/k", "")
	want(t, "rejected try-begin created nothing", code, b, 200, "status", "NotFound")
	code, b, _ = call(t, reject, "GET", "/v1/inbox", "")
	want(t, "discovery", code, b, 200, "leasePolicy", "reject")
	if fmt.Sprint(b["leaseSeconds"]) != "map[default:15 max:20 min:10]" || b["auth"] != "none" {
		t.Fatalf("discovery %v", b)
	}
}

func TestServer_bearer_auth(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	const token = "tok-123-secret-value"
	h := newServer(t, server.Config{Token: token, Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	for _, hdr := range [][]string{nil, {"Authorization", "Bearer nope"}, {"Authorization", "Basic " + token}, {"Authorization", token}} {
		code, b, rh := call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k"}`, hdr...)
		want(t, fmt.Sprintf("try-begin with %v", hdr), code, b, 401, "error", "unauthorized")
		if !strings.HasPrefix(rh.Get("WWW-Authenticate"), "Bearer") {
			t.Fatalf("401 without WWW-Authenticate: %v", rh)
		}
		code, b, _ = call(t, h, "GET", "/v1/inbox/k", "", hdr...)
		want(t, "get without the token", code, b, 401, "error", "unauthorized")
	}
	code, b, _ := call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k"}`, "Authorization", "Bearer "+token)
	want(t, "try-begin with the token", code, b, 200, "status", "Acquired")
	code, b, _ = call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k2"}`, "Authorization", "bearer "+token)
	want(t, "scheme is case-insensitive", code, b, 200, "status", "Acquired")
	code, b, _ = call(t, h, "GET", "/v1/inbox", "")
	want(t, "discovery needs no token", code, b, 200, "auth", "bearer")
	if strings.Contains(logs.String(), token) || strings.Contains(logs.String(), `{"key":"k"}`) {
		t.Fatalf("logs hold the token or a body:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "unauthorized request") {
		t.Fatalf("refused requests not logged:\n%s", logs.String())
	}
}

// A token rotation without downtime: the old and the new token both
// accepted, then only the new one; SetTokens refuses what would lock every
// client out or turn auth on behind the discovery document's back.
func TestServer_token_rotation(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{Token: "old-token-000000001", Tokens: []string{"new-token-000000001"}})
	accepted := func(tok string) bool {
		code, _, _ := call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"rot"}`, "Authorization", "Bearer "+tok)
		return code == 200
	}
	if !accepted("old-token-000000001") || !accepted("new-token-000000001") || accepted("other") {
		t.Fatal("Token and Tokens: want old and new accepted, any other refused")
	}
	if err := h.SetTokens("new-token-000000001"); err != nil {
		t.Fatal(err)
	}
	if accepted("old-token-000000001") || !accepted("new-token-000000001") {
		t.Fatal("after SetTokens(new): want only the new token accepted")
	}
	for _, bad := range [][]string{nil, {"a", ""}} {
		if err := h.SetTokens(bad...); !errors.Is(err, server.ErrInvalidConfig) {
			t.Errorf("SetTokens(%q): %v, want ErrInvalidConfig", bad, err)
		}
	}
	if !accepted("new-token-000000001") {
		t.Fatal("a refused SetTokens changed the tokens")
	}
	open := newServer(t, server.Config{})
	if err := open.SetTokens("x"); !errors.Is(err, server.ErrInvalidConfig) {
		t.Errorf("SetTokens on a server without auth: %v, want ErrInvalidConfig", err)
	}
	if _, err := server.New(server.Config{Store: newMemory(t), Tokens: []string{"ok-token-00000001", ""}}); !errors.Is(err, server.ErrInvalidConfig) {
		t.Errorf("an empty entry in Tokens: %v, want ErrInvalidConfig", err)
	}
	code, b, _ := call(t, newServer(t, server.Config{Tokens: []string{"only-token-0000001"}}), "GET", "/v1/inbox", "")
	want(t, "Tokens alone turn auth on", code, b, 200, "auth", "bearer")
}

// rawGet sends a request line exactly as given over TCP and returns the
// status line and body.
func rawGet(t *testing.T, addr, target string) (string, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", target)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status, string(b)
}

// Path cleaning and redirects must never touch a key: the server reads the
// escaped path itself, over a real connection.
func TestServer_key_path_never_cleaned_or_redirected(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()
	keys := map[string]string{ // escaped form -> key
		"%2E%2E": "..", "%2E": ".", "..": "..", ".": ".", "a%2F..%2Fb": "a/../b", "a/../b": "a/../b",
		"%2F%2Fx": "//x", "/x": "/x", "%25": "%", "%3F%23": "?#", "a%20b": "a b", "%E2%9C%93": "✓",
		"%252E": "%2E", "./x/": "./x/",
	}
	for esc, key := range keys {
		body, _ := json.Marshal(map[string]string{"key": key})
		code, b, _ := call(t, h, "POST", "/v1/inbox/try-begin", string(body))
		if code != 200 || (b["status"] != "Acquired" && b["status"] != "Busy") {
			t.Fatalf("try-begin %q: %d %v", key, code, b)
		}
		status, got := rawGet(t, addr, "/v1/inbox/"+esc)
		if !strings.HasPrefix(status, "200") || !strings.Contains(got, `"InProgress"`) {
			t.Errorf("GET /v1/inbox/%s (key %q) = %s %s, want 200 InProgress", esc, key, status, got)
		}
	}
	if status, _ := rawGet(t, addr, "/v1/inbox/%zz"); !strings.HasPrefix(status, "400") {
		t.Errorf("GET of a badly escaped key = %s, want 400", status)
	}
	for _, target := range []string{"/v1/inbox/..", "/v1/inbox/../x", "/v1//inbox", "/v1/inbox/./", "//v1/inbox/x", "/v1/inbox/%2e%2e/"} {
		status, _ := rawGet(t, addr, target)
		if strings.HasPrefix(status, "3") {
			t.Errorf("GET %s redirected: %s", target, status)
		}
	}
}

// failing is a store whose every call fails with err.
type failing struct {
	inbox.LeaseStore
	err error
}

func (f failing) TryBegin(context.Context, string, inbox.BeginOptions) (inbox.Claim, error) {
	return inbox.Claim{}, f.err
}
func (f failing) Get(context.Context, string) (inbox.Record, error) { return inbox.Record{}, f.err }
func (f failing) Extend(context.Context, string, string, time.Duration) (time.Time, error) {
	return time.Time{}, f.err
}

func TestServer_store_failures(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	for _, c := range []struct {
		err  error
		code int
		ecod string
	}{
		{fmt.Errorf("%w: redis down", inbox.ErrStoreUnavailable), 503, "store_unavailable"},
		{inbox.ErrClosed, 503, "store_unavailable"},
		{errors.New("disk on fire"), 500, "internal_error"},
		{inbox.ErrNotSupported, 501, "not_supported"},
	} {
		h := newServer(t, server.Config{Store: failing{newMemory(t), c.err}, Logger: log})
		code, b, _ := call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k"}`)
		want(t, fmt.Sprintf("try-begin over %v", c.err), code, b, c.code, "error", c.ecod)
		code, _, _ = call(t, h, "GET", "/readyz", "")
		if code != 503 {
			t.Errorf("readyz over a failing store = %d, want 503", code)
		}
	}
	if !strings.Contains(logs.String(), "disk on fire") || !strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Fatalf("store failure not logged at error:\n%s", logs.String())
	}
}

func TestServer_ready_health_drain_and_metrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	h := newServer(t, server.Config{Registerer: reg})
	code, b, _ := call(t, h, "GET", "/healthz", "")
	want(t, "healthz", code, b, 200, "status", "OK")
	code, b, _ = call(t, h, "GET", "/readyz", "")
	want(t, "readyz", code, b, 200, "status", "OK")
	call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k"}`)
	call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k"}`)
	call(t, h, "POST", "/v1/inbox/try-begin", `{`)
	h.Drain()
	code, b, _ = call(t, h, "GET", "/readyz", "")
	want(t, "readyz while draining", code, b, 503, "status", "draining")
	code, b, _ = call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k3"}`)
	want(t, "serving while draining", code, b, 200, "status", "Acquired")

	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Host = "localhost:8080"
	h.ServeHTTP(rec, req)
	for _, line := range []string{
		`inbox_server_requests_total{code="200",endpoint="try-begin",status="Acquired"} 2`,
		`inbox_server_requests_total{code="200",endpoint="try-begin",status="Busy"} 1`,
		`inbox_server_requests_total{code="400",endpoint="try-begin",status="invalid_json"} 1`,
		`inbox_server_requests_total{code="503",endpoint="readyz",status="draining"} 1`,
		`inbox_server_request_duration_seconds_count{endpoint="try-begin"} 4`,
	} {
		if !strings.Contains(rec.Body.String(), line) {
			t.Errorf("/metrics lacks %s", line)
		}
	}
	if n := testutil.CollectAndCount(reg, "inbox_server_requests_total"); n < 4 {
		t.Fatalf("%d request series registered", n)
	}
}

func TestConfig_validate(t *testing.T) {
	t.Parallel()
	m := newMemory(t)
	for name, cfg := range map[string]server.Config{
		"no store":          {},
		"fractional lease":  {Store: m, LeaseMin: 1500 * time.Millisecond},
		"min above max":     {Store: m, LeaseMin: time.Minute, LeaseMax: 30 * time.Second, LeaseDefault: time.Minute},
		"default outside":   {Store: m, LeaseDefault: 10 * time.Minute},
		"unknown policy":    {Store: m, LeasePolicy: "maybe"},
		"tiny body":         {Store: m, MaxBodyBytes: 10},
		"key over max":      {Store: m, MaxKeyBytes: 2000},
		"registerer only":   {Store: m, Registerer: prometheus.WrapRegistererWithPrefix("x_", prometheus.NewRegistry())},
		"negative ready to": {Store: m, ReadyTimeout: -1},
	} {
		if _, err := server.New(cfg); !errors.Is(err, server.ErrInvalidConfig) || !errors.Is(err, inbox.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := server.New(server.Config{Store: m, Token: "secret-value-0000", LeasePolicy: "x"}); err == nil || strings.Contains(err.Error(), "secret-value-0000") {
		t.Fatalf("Validate error %v quotes the token or is nil", err)
	}
	reg := prometheus.NewRegistry()
	if _, err := server.New(server.Config{Store: m, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := server.New(server.Config{Store: m, Registerer: reg}); err == nil {
		t.Fatal("registering the metrics twice on one registry did not fail")
	}
}

// hung is a store whose TryBegin waits for its context.
type hung struct{ inbox.LeaseStore }

func (hung) TryBegin(ctx context.Context, _ string, _ inbox.BeginOptions) (inbox.Claim, error) {
	<-ctx.Done()
	return inbox.Claim{}, fmt.Errorf("%w: %w", inbox.ErrStoreUnavailable, ctx.Err())
}

func TestServer_store_timeout(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{Store: hung{newMemory(t)}, StoreTimeout: 50 * time.Millisecond})
	start := time.Now()
	code, b, hdr := call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k"}`)
	want(t, "try-begin over a hung store", code, b, 503, "error", "store_unavailable")
	if el := time.Since(start); el > 5*time.Second || hdr.Get("Retry-After") == "" {
		t.Fatalf("answered after %s with headers %v; want a prompt 503 with Retry-After", el, hdr)
	}
}

// The status label takes one vocabulary across endpoints: the v1 status of
// a 200 answer of the protocol, OK for another 200, and the error code of
// the body for an error, /readyz's 503 included.
func TestServer_status_label_vocabulary(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	store := newMemory(t)
	h := newServer(t, server.Config{Store: store, Registerer: reg, Token: "consumer-token-t0k", AdminTokens: []string{"admin-token-0001"}, LeaseMin: time.Second})
	auth := []string{"Authorization", "Bearer consumer-token-t0k"}
	post := func(path, body string) map[string]any {
		a := auth
		if strings.Contains("/v1/inbox/list /v1/inbox/force-release /v1/inbox/forget", path) {
			a = []string{"Authorization", "Bearer admin-token-0001"}
		}
		_, b, _ := call(t, h, "POST", path, body, a...)
		return b
	}
	for _, path := range []string{"/v1/inbox", "/healthz", "/readyz", "/metrics"} {
		req := httptest.NewRequest("GET", path, nil)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	lease := post("/v1/inbox/try-begin", `{"key":"a","leaseSeconds":5}`)["leaseId"]
	post("/v1/inbox/try-begin", `{"key":"a"}`)
	post("/v1/inbox/extend", fmt.Sprintf(`{"key":"a","leaseId":%q}`, lease))
	post("/v1/inbox/extend", `{"key":"a","leaseId":"other"}`)
	post("/v1/inbox/release", `{"key":"a","leaseId":"other"}`)
	call(t, h, "GET", "/v1/inbox/a", "", auth...)
	post("/v1/inbox/mark-processed", fmt.Sprintf(`{"key":"a","leaseId":%q}`, lease))
	post("/v1/inbox/try-begin", `{"key":"a"}`)
	lease = post("/v1/inbox/try-begin", `{"key":"b"}`)["leaseId"]
	post("/v1/inbox/release", fmt.Sprintf(`{"key":"b","leaseId":%q}`, lease))
	call(t, h, "GET", "/v1/inbox/b", "", auth...)
	call(t, h, "GET", "/v1/inbox/c", "", auth...)
	call(t, h, "GET", "/v1/inbox/a", "", auth...)
	lease = post("/v1/inbox/try-begin", `{"key":"d"}`)["leaseId"]
	post("/v1/inbox/fail", fmt.Sprintf(`{"key":"d","leaseId":%q,"dead":true}`, lease)) // Dead
	post("/v1/inbox/fail", fmt.Sprintf(`{"key":"d","leaseId":%q}`, lease))             // LeaseLost
	post("/v1/inbox/try-begin", `{"key":"d","acceptDead":true}`)                       // Dead
	call(t, h, "GET", "/v1/inbox/d?acceptDead=true", "", auth...)                      // Dead
	lease = post("/v1/inbox/try-begin", `{"key":"e"}`)["leaseId"]
	post("/v1/inbox/fail", fmt.Sprintf(`{"key":"e","leaseId":%q,"retryAfterMs":1}`, lease))                                              // Released
	post("/v1/inbox/list", `{}`)                                                                                                         // OK
	post("/v1/inbox/force-release", `{"key":"e"}`)                                                                                       // Released
	post("/v1/inbox/forget", `{"key":"e"}`)                                                                                              // Forgotten
	call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"a"}`)                                                                             // 401
	call(t, h, "POST", "/v1/inbox/forget", `{"key":"a"}`, auth...)                                                                       // 403, a consumer's token
	call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"a"}`, "Authorization", "Bearer consumer-token-t0k", "Content-Type", "text/plain") // 415
	post("/v1/inbox/try-begin", `{`)                                                                                                     // 400
	post("/v1/inbox/try-begin", `{"key":""}`)                                                                                            // 400 invalid_key
	post("/v1/inbox/try-begin", `{"key":"`+strings.Repeat("x", 20000)+`"}`)                                                              // 413
	call(t, h, "DELETE", "/v1/inbox", "")                                                                                                // 405
	call(t, h, "GET", "/nowhere", "")                                                                                                    // 404
	_ = store.Close()
	call(t, h, "GET", "/readyz", "")           // 503 store_unavailable
	post("/v1/inbox/try-begin", `{"key":"z"}`) // 503 store_unavailable
	h.Drain()
	call(t, h, "GET", "/readyz", "") // 503 draining

	v1 := map[string]bool{"Acquired": true, "Processed": true, "Busy": true, "Dead": true, "Released": true, "Extended": true,
		"LeaseLost": true, "Forgotten": true, "NotFound": true, "Available": true, "InProgress": true, "OK": true}
	codes := map[string]bool{"invalid_json": true, "invalid_key": true, "invalid_lease": true, "invalid_lease_id": true,
		"invalid_argument": true, "body_too_large": true, "unauthorized": true, "not_found": true, "method_not_allowed": true,
		"not_supported": true, "store_unavailable": true, "internal_error": true, "draining": true,
		"forbidden": true, "unsupported_media_type": true}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "inbox_server_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			st := l["status"]
			seen[st] = true
			if l["code"] == "200" && !v1[st] || l["code"] != "200" && !codes[st] {
				t.Errorf("endpoint %s answered %s with status label %q: outside the vocabulary", l["endpoint"], l["code"], st)
			}
		}
	}
	for st := range v1 {
		if !seen[st] {
			t.Errorf("status %s never counted: the test misses a case", st)
		}
	}
	for _, st := range []string{"invalid_json", "invalid_key", "body_too_large", "unauthorized", "forbidden", "unsupported_media_type", "not_found", "method_not_allowed", "store_unavailable", "draining"} {
		if !seen[st] {
			t.Errorf("error code %s never counted: the test misses a case", st)
		}
	}
}
