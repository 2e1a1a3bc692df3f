package openapitest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/memory"
	"github.com/watermill-inbox/inbox/stores/remote"
	"github.com/watermill-inbox/inbox/stores/remote/server"
	"github.com/watermill-inbox/inbox/stores/storetest"
)

func loadSpec(t testing.TB) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile("../openapi.yaml")
	if err != nil {
		t.Fatalf("loading openapi.yaml: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI 3 document: %v", err)
	}
	return doc
}

// route finds the operation of a request by its escaped path, as the server
// dispatches (a router would unescape the key and lose %2F).
func route(doc *openapi3.T, r *http.Request) (*routers.Route, map[string]string) {
	p := r.URL.EscapedPath()
	tmpl, params := p, map[string]string{}
	if strings.HasPrefix(p, "/v1/inbox/") && (r.Method != http.MethodPost || doc.Paths.Value(p) == nil) {
		tmpl = "/v1/inbox/{key}"
		params["key"] = strings.TrimPrefix(p, "/v1/inbox/")
	}
	item := doc.Paths.Value(tmpl)
	if item == nil {
		return nil, nil
	}
	op := item.GetOperation(r.Method)
	if op == nil {
		return nil, nil
	}
	return &routers.Route{Spec: doc, Path: tmpl, PathItem: item, Method: r.Method, Operation: op}, params
}

var filterOpts = &openapi3filter.Options{
	AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
	IncludeResponseStatus: true,
	MultiError:            true,
}

// validator checks requests (when checkRequests) and every answer against
// the document, and counts the statuses seen.
type validator struct {
	t             testing.TB
	doc           *openapi3.T
	next          http.Handler
	checkRequests bool

	mu   sync.Mutex
	seen map[string]int // "operationId code status"
}

func (v *validator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	rt, params := route(v.doc, r)
	ctx := context.Background()
	var in *openapi3filter.RequestValidationInput
	if rt != nil {
		in = &openapi3filter.RequestValidationInput{Request: r.Clone(ctx), PathParams: params, Route: rt, Options: filterOpts}
		in.Request.Body = io.NopCloser(bytes.NewReader(body))
		if v.checkRequests {
			if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
				v.t.Errorf("%s %s %s: request does not follow openapi.yaml: %v", r.Method, r.URL.EscapedPath(), body, err)
			}
		}
	}
	rec := httptest.NewRecorder()
	v.next.ServeHTTP(rec, r)
	res := rec.Result()
	answer := rec.Body.Bytes()
	if in != nil {
		err := openapi3filter.ValidateResponse(ctx, &openapi3filter.ResponseValidationInput{
			RequestValidationInput: in, Status: res.StatusCode, Header: res.Header,
			Body: io.NopCloser(bytes.NewReader(answer)), Options: filterOpts,
		})
		if err != nil {
			v.t.Errorf("%s %s: answer %d %s does not follow openapi.yaml: %v", r.Method, r.URL.EscapedPath(), res.StatusCode, answer, err)
		}
		var st struct {
			Status, Error string
			Backoff       bool
		}
		_ = json.Unmarshal(answer, &st)
		if st.Backoff {
			st.Status += " backoff"
		}
		v.mu.Lock()
		v.seen[fmt.Sprintf("%s %d %s%s", rt.Operation.OperationID, res.StatusCode, st.Status, st.Error)]++
		v.mu.Unlock()
	} else if err := v.doc.Components.Schemas["Error"].Value.VisitJSON(decode(answer)); err != nil || res.StatusCode < 400 {
		// A path or method the document has no operation for: an Error.
		v.t.Errorf("%s %s (no operation): answer %d %s is not an Error: %v", r.Method, r.URL.EscapedPath(), res.StatusCode, answer, err)
	}
	for k, vs := range res.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(res.StatusCode)
	_, _ = w.Write(answer)
}

func decode(b []byte) any {
	var v any
	_ = json.Unmarshal(b, &v)
	return v
}

func newValidator(t *testing.T, cfg server.Config, checkRequests bool) (*validator, string) {
	t.Helper()
	if cfg.Store == nil {
		m, err := memory.New(memory.Options{Retention: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		cfg.Store = m
	}
	if cfg.LeaseMin == 0 {
		cfg.LeaseMin = time.Second
	}
	h, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v := &validator{t: t, doc: loadSpec(t), next: h, checkRequests: checkRequests, seen: map[string]int{}}
	srv := httptest.NewServer(v)
	t.Cleanup(srv.Close)
	return v, srv.URL
}

// The whole conformance suite through the client, every request and answer
// checked against the document.
func TestServerAndClient_follow_openapi_during_storetest(t *testing.T) {
	var mu sync.Mutex
	var all []*validator
	t.Cleanup(func() {
		seen := map[string]int{}
		for _, v := range all {
			for k, n := range v.seen {
				seen[k] += n
			}
		}
		for _, want := range []string{
			"tryBegin 200 Acquired", "tryBegin 200 Busy", "tryBegin 200 Busy backoff", "tryBegin 200 Processed", "markProcessed 200 Processed",
			"markProcessed 200 LeaseLost", "release 200 Released", "release 200 LeaseLost", "extend 200 Extended",
			"extend 200 LeaseLost", "getRecord 200 NotFound", "getRecord 200 Available", "getRecord 200 InProgress",
			"getRecord 200 Processed", "discovery 200 ", "tryBegin 200 Dead", "getRecord 200 Dead", "fail 200 Released",
			"fail 200 Dead", "fail 200 LeaseLost", "list 200 ", "forget 200 Forgotten", "forceRelease 200 Released",
		} {
			if seen[want] == 0 {
				t.Errorf("the suite never produced %q, so it was never checked; seen: %v", want, seen)
			}
		}
	})
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T, cfg storetest.Config) inbox.LeaseStore {
			m, err := memory.New(memory.Options{Retention: cfg.Retention})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Close() })
			v, base := newValidator(t, server.Config{Store: m, AdminNoAuth: true}, true)
			mu.Lock()
			all = append(all, v)
			mu.Unlock()
			s, err := remote.New(remote.Options{URL: base})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Lease:     time.Second,
		Retention: time.Second,
	})
}

// failing is a store whose TryBegin, Get and Extend fail with err.
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

// Error answers, sent raw (the requests are bad on purpose: only the
// answers are checked).
func TestServer_error_answers_follow_openapi(t *testing.T) {
	t.Parallel()
	v, base := newValidator(t, server.Config{Token: "consumer-token-01", AdminTokens: []string{"admin-token-0001"}, LeasePolicy: server.PolicyReject, MaxBodyBytes: 2048, MaxRetryAfter: time.Hour}, false)
	// send sends a request with the consumer's token (auth), the admin's
	// (on the admin endpoints) or none; hdr (name, value, ...) overrides
	// the Content-Type of a body (application/json) or sets the Host.
	send := func(method, path, body string, auth bool, hdr ...string) int {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if auth {
			tok := "consumer-token-01"
			if strings.HasSuffix(path, "/list") || strings.HasSuffix(path, "/forget") || strings.HasSuffix(path, "/force-release") {
				tok = "admin-token-0001"
			}
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			if hdr[i] == "Host" {
				req.Host = hdr[i+1]
			} else {
				req.Header.Set(hdr[i], hdr[i+1])
			}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		method, path, body string
		auth               bool
		code               int
	}{
		{"POST", "/v1/inbox/try-begin", `{"key":"k"}`, false, 401},
		{"GET", "/v1/inbox/k", ``, false, 401},
		{"POST", "/v1/inbox/try-begin", `{`, true, 400},
		{"POST", "/v1/inbox/try-begin", `{"key":""}`, true, 400},
		{"POST", "/v1/inbox/try-begin", `{"key":"k","leaseSeconds":500}`, true, 400},
		{"POST", "/v1/inbox/release", `{"key":"k"}`, true, 400},
		{"POST", "/v1/inbox/extend", `{"key":"k","leaseId":"x","leaseSeconds":0}`, true, 400},
		{"POST", "/v1/inbox/mark-processed", `{"key":"` + strings.Repeat("k", 4096) + `"}`, true, 413},
		{"GET", "/v1/inbox/%FF", ``, true, 400},
		{"DELETE", "/v1/inbox/k", ``, true, 405},
		{"POST", "/v1/inbox", `{}`, true, 405},
		{"GET", "/v2/nothing", ``, true, 404},
		{"GET", "/healthz", ``, false, 200},
		{"GET", "/readyz", ``, false, 200},
		{"GET", "/metrics", ``, false, 401},
		{"GET", "/metrics", ``, true, 200},
		{"GET", "/v1/inbox", ``, false, 200},
		{"POST", "/v1/inbox/fail", `{"key":"k","leaseId":"L"}`, false, 401},
		{"POST", "/v1/inbox/fail", `{"key":"k"}`, true, 400},
		{"POST", "/v1/inbox/fail", `{"key":"k","leaseId":"L","retryAfterMs":-1}`, true, 400},
		{"POST", "/v1/inbox/fail", `{"key":"k","leaseId":"L","retryAfterMs":3600001}`, true, 400},
		{"POST", "/v1/inbox/try-begin", "{\"key\":\"k\xff\"}", true, 400},
		{"POST", "/v1/inbox/try-begin", `{"key":"k\udc00"}`, true, 400},
		{"POST", "/v1/inbox/try-begin", `{"key":"a","key":"b"}`, true, 400},
		{"POST", "/v1/inbox/fail", `{"key":"k","leaseId":"L","reason":"` + strings.Repeat("r", 1025) + `"}`, true, 400},
		{"POST", "/v1/inbox/list", `{}`, false, 401},
		{"POST", "/v1/inbox/list", `{"state":"Sleeping"}`, true, 400},
		{"POST", "/v1/inbox/list", `{"limit":1001}`, true, 400},
		{"POST", "/v1/inbox/forget", `{}`, true, 400},
		{"POST", "/v1/inbox/force-release", `{"key":""}`, false, 401},
		{"POST", "/v1/inbox/force-release", `{"key":""}`, true, 400},
		{"PUT", "/v1/inbox/fail", `{}`, true, 405},
		// A client before the fail extension, and a dead key: Busy, and
		// InProgress, until the record expires.
		{"POST", "/v1/inbox/try-begin", `{"key":"dead","leaseId":"D"}`, true, 200},
		{"POST", "/v1/inbox/fail", `{"key":"dead","leaseId":"D","dead":true,"reason":"r"}`, true, 200},
		{"POST", "/v1/inbox/try-begin", `{"key":"dead"}`, true, 200},
		{"GET", "/v1/inbox/dead", ``, true, 200},
		{"GET", "/v1/inbox/dead?acceptDead=true", ``, true, 200},
		{"POST", "/v1/inbox/list", `{"state":"Dead","limit":1}`, true, 200},
	} {
		if got := send(c.method, c.path, c.body, c.auth); got != c.code {
			t.Errorf("%s %s %s = %d, want %d", c.method, c.path, c.body, got, c.code)
		}
	}
	// A consumer's token on the admin endpoints; bodies that are not JSON.
	for _, path := range []string{"/v1/inbox/list", "/v1/inbox/forget", "/v1/inbox/force-release"} {
		req, _ := http.NewRequest("POST", base+path, strings.NewReader(`{"key":"k"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer consumer-token-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 403 {
			t.Errorf("%s with a consumer's token = %d, want 403", path, resp.StatusCode)
		}
	}
	for _, path := range []string{"/v1/inbox/try-begin", "/v1/inbox/forget", "/v1/inbox/fail"} {
		if got := send("POST", path, `{"key":"k"}`, true, "Content-Type", "text/plain"); got != 415 {
			t.Errorf("POST %s as text/plain = %d, want 415", path, got)
		}
	}
	for _, f := range []struct {
		err  error
		code int
	}{
		{inbox.ErrStoreUnavailable, 503}, {errors.New("boom"), 500}, {inbox.ErrNotSupported, 501},
	} {
		m, _ := memory.New(memory.Options{})
		t.Cleanup(func() { _ = m.Close() })
		_, fbase := newValidator(t, server.Config{Store: failing{m, f.err}}, true)
		base = fbase
		if got := send("POST", "/v1/inbox/extend", `{"key":"k","leaseId":"x","leaseSeconds":5}`, false); got != f.code {
			t.Errorf("extend over a store failing with %v = %d, want %d", f.err, got, f.code)
		}
		if f.code != 501 {
			if got := send("POST", "/v1/inbox/try-begin", `{"key":"k"}`, false); got != f.code {
				t.Errorf("try-begin over a store failing with %v = %d", f.err, got)
			}
			if got := send("GET", "/readyz", ``, false); got != 503 {
				t.Errorf("readyz over a failing store = %d", got)
			}
		}
	}
	for _, want := range []string{"tryBegin 200 Busy", "getRecord 200 InProgress", "getRecord 200 Dead", "list 200 ", "discovery 200 ",
		"forget 403 forbidden", "list 403 forbidden", "tryBegin 415 unsupported_media_type", "fail 415 unsupported_media_type"} {
		if v.seen[want] == 0 {
			t.Errorf("no %q answer was checked; seen %v", want, v.seen)
		}
	}
	// A store without admin operations: 501 on the admin endpoints.
	m, _ := memory.New(memory.Options{})
	t.Cleanup(func() { _ = m.Close() })
	_, base = newValidator(t, server.Config{Store: plain{m}, AdminNoAuth: true}, true)
	for _, path := range []string{"/v1/inbox/list", "/v1/inbox/forget", "/v1/inbox/force-release"} {
		if got := send("POST", path, `{"key":"k"}`, false); got != 501 {
			t.Errorf("%s over a store without admin operations = %d, want 501", path, got)
		}
	}
	// A server without tokens: a web page's requests (an Origin, a Host
	// that is not loopback) are refused; the admin endpoints are off
	// without AdminNoAuth.
	nv, nbase := newValidator(t, server.Config{}, false)
	base = nbase
	for _, c := range []struct {
		method, path, body string
		hdr                []string
	}{
		{"POST", "/v1/inbox/forget", `{"key":"order:42"}`, []string{"Origin", "http://attacker.example", "Content-Type", "text/plain"}},
		{"POST", "/v1/inbox/try-begin", `{"key":"k"}`, []string{"Origin", "http://attacker.example"}},
		{"GET", "/v1/inbox/k", ``, []string{"Host", "attacker.example:8080"}},
		{"GET", "/v1/inbox", ``, []string{"Host", "attacker.example:8080"}},
		{"GET", "/metrics", ``, []string{"Host", "attacker.example:8080"}},
		{"POST", "/v1/inbox/try-begin", `{"key":"k"}`, []string{"X-Forwarded-For", "203.0.113.7"}},
		{"POST", "/v1/inbox/list", `{}`, nil},
	} {
		if got := send(c.method, c.path, c.body, false, c.hdr...); got != 403 {
			t.Errorf("%s %s with %q on a server without tokens = %d, want 403", c.method, c.path, c.hdr, got)
		}
	}
	if nv.seen["getRecord 403 forbidden"] == 0 || nv.seen["discovery 403 forbidden"] == 0 {
		t.Errorf("the 403 answers were not checked: %v", nv.seen)
	}
}

// plain hides the memory store's admin operations.
type plain struct{ inbox.LeaseStore }

// Keys that need escaping round-trip through the documented path form.
func TestKeyPath_follows_openapi(t *testing.T) {
	t.Parallel()
	_, base := newValidator(t, server.Config{}, true)
	s, err := remote.New(remote.Options{URL: base})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for _, k := range []string{"..", "a/b", "%", "?#", "é", url.PathEscape("x y")} {
		c, err := s.TryBegin(ctx, k, inbox.BeginOptions{})
		if err != nil || c.Status != inbox.Acquired {
			t.Fatalf("TryBegin(%q): %+v, %v", k, c, err)
		}
		if r, err := s.Get(ctx, k); err != nil || r.State != inbox.StateInProgress {
			t.Fatalf("Get(%q): %+v, %v", k, r, err)
		}
	}
}

// The 429 answers of the server's limits (live records, request rate,
// failed authentications) follow the document, Retry-After included.
func TestServer_limit_answers_follow_openapi(t *testing.T) {
	t.Parallel()
	const tok = "consumer-token-01"
	v, base := newValidator(t, server.Config{Token: tok, MaxRecordsPerToken: 1, AuthFailuresPerMinute: 2}, true)
	rv, rbase := newValidator(t, server.Config{Token: tok, RequestsPerSecond: 1}, true)
	send := func(method, path, body, token string) int {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	send("POST", "/v1/inbox/try-begin", `{"key":"a"}`, tok)
	if got := send("POST", "/v1/inbox/mark-processed", `{"key":"b"}`, tok); got != 429 {
		t.Errorf("a second record past MaxRecordsPerToken 1 = %d, want 429", got)
	}
	for n := 0; n < 1000 && rv.count("getRecord 429 rate_limited") == 0; n++ {
		req, _ := http.NewRequest("GET", rbase+"/v1/inbox/a", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if rv.count("getRecord 429 rate_limited") == 0 {
		t.Errorf("no rate_limited answer was checked; seen %v", rv.seen)
	}
	for range 3 {
		send("POST", "/v1/inbox/try-begin", `{"key":"a"}`, "wrong-token-guess")
	}
	for _, want := range []string{"markProcessed 429 quota_exceeded", "tryBegin 429 too_many_auth_failures"} {
		if v.count(want) == 0 {
			t.Errorf("no %q answer was checked; seen %v", want, v.seen)
		}
	}
}

func (v *validator) count(key string) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.seen[key]
}
