package server_test

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox/stores/remote/server"
)

// What a web page can send, or a client that does not speak the protocol:
// a POST that is not application/json is refused with 415 and the
// protocol's JSON error body, before the body is read.
func TestServer_posts_must_be_json(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{AdminNoAuth: true})
	for _, ct := range []string{"text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
		"application/json; charset=latin1", "application/jsonx", "application/json; foo=bar", "", "garbage;;"} {
		for _, path := range []string{"try-begin", "mark-processed", "forget", "list"} {
			code, b, _ := call(t, h, "POST", "/v1/inbox/"+path, `{"key":"order:42"}`, "Content-Type", ct)
			want(t, fmt.Sprintf("POST %s as %q", path, ct), code, b, 415, "error", "unsupported_media_type")
			if msg, _ := b["message"].(string); !strings.Contains(msg, "application/json") {
				t.Errorf("415 message %q does not say what to send", msg)
			}
		}
	}
	if _, b, _ := call(t, h, "GET", "/v1/inbox/order:42", ""); b["status"] != "NotFound" {
		t.Fatalf("a refused POST changed the key: %v", b)
	}
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON; charset=UTF-8"} {
		code, b, _ := call(t, h, "POST", "/v1/inbox/mark-processed", `{"key":"order:42"}`, "Content-Type", ct)
		want(t, "mark-processed as "+ct, code, b, 200, "status", "Processed")
	}
}

// A server without tokens refuses what a browser sends for a web page: any
// request with an Origin header (a cross-site form POST), and any whose Host
// is not a loopback name or address (DNS rebinding: the page's own name,
// rebound to 127.0.0.1). /healthz and /readyz answer anyone.
func TestServer_without_token_refuses_browsers(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{AdminNoAuth: true, AllowedHosts: []string{"inbox.internal", "10.0.0.5", "[fd00::5]"}})
	call(t, h, "POST", "/v1/inbox/mark-processed", `{"key":"order:42"}`)
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/inbox/forget", `{"key":"order:42"}`},
		{"POST", "/v1/inbox/force-release", `{"key":"order:42"}`},
		{"POST", "/v1/inbox/mark-processed", `{"key":"order:43"}`},
		{"POST", "/v1/inbox/list", `{}`},
		{"GET", "/v1/inbox/order:42", ``},
		{"GET", "/v1/inbox", ``},
		{"GET", "/metrics", ``},
	} {
		for _, hdr := range [][]string{
			{"Origin", "http://attacker.example"},
			{"Origin", "null"},
			{"Origin", ""},
			{"Origin", "http://attacker.example", "Content-Type", "text/plain"},
			{"Host", "attacker.example:8080"},
			{"Host", "attacker.example"},
			{"Host", "localhost.attacker.example"},
			{"Host", "127.0.0.1.nip.io:8080"},
			{"Host", ""},
			{"Host", "0.0.0.0:8080"},
			{"Host", "10.0.0.6:8080"},
		} {
			code, b, _ := call(t, h, c.method, c.path, c.body, hdr...)
			want(t, fmt.Sprintf("%s %s with %q", c.method, c.path, hdr), code, b, 403, "error", "forbidden")
		}
	}
	if _, b, _ := call(t, h, "GET", "/v1/inbox/order:42", ""); b["status"] != "Processed" {
		t.Fatalf("a refused request changed the key: %v", b)
	}
	for _, host := range []string{"localhost", "LocalHost:8080", "127.0.0.1", "127.0.0.1:8080", "127.9.9.9:1", "[::1]:8080", "::1", "[::ffff:127.0.0.1]:80",
		"inbox.internal", "INBOX.internal:8080", "10.0.0.5:8080", "[fd00::5]:8080"} {
		code, b, _ := call(t, h, "GET", "/v1/inbox/order:42", "", "Host", host)
		want(t, "GET with Host "+host, code, b, 200, "status", "Processed")
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		code, b, _ := call(t, h, "GET", path, "", "Host", "attacker.example", "Origin", "http://attacker.example")
		want(t, path+" from anywhere", code, b, 200, "status", "OK")
	}
	// With bearer auth a page cannot send the token: Origin and Host are
	// the token's business, not the server's.
	ht := newServer(t, server.Config{Token: "consumer-token-t0k"})
	code, b, _ := call(t, ht, "POST", "/v1/inbox/try-begin", `{"key":"k"}`, "Authorization", "Bearer consumer-token-t0k", "Host", "inbox.example.com", "Origin", "https://app.example.com")
	want(t, "a token over any Host and Origin", code, b, 200, "status", "Acquired")
	code, b, _ = call(t, ht, "POST", "/v1/inbox/try-begin", `{"key":"k"}`, "Host", "inbox.example.com", "Origin", "https://app.example.com")
	want(t, "no token over any Host and Origin", code, b, 401, "error", "unauthorized")
}

// A consumer's token may be limited to key prefixes: a call on a key
// outside them is refused with 403 on every endpoint, GET included, and
// changes nothing. An admin's token touches every key.
func TestServer_token_key_prefixes(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{LeaseMin: time.Second, AdminTokens: []string{"admin-token-0001"}, Tokens: []string{"any-key-token-0001"}, Grants: []server.Grant{
		{Token: "billing-token-0001", Prefixes: []string{"rabbit:billing:", "kafka:billing:"}},
	}})
	as := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	code, b, _ := call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"rabbit:shipping:h:1","leaseId":"S"}`, as("any-key-token-0001")...)
	want(t, "an unlimited token", code, b, 200, "status", "Acquired")
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/inbox/try-begin", `{"key":"rabbit:shipping:h:1"}`},
		{"POST", "/v1/inbox/try-begin", `{"key":"rabbit:billing"}`},
		{"POST", "/v1/inbox/try-begin", `{"key":"RABBIT:billing:h:1"}`},
		{"POST", "/v1/inbox/mark-processed", `{"key":"rabbit:shipping:h:1"}`},
		{"POST", "/v1/inbox/mark-processed", `{"key":"rabbit:shipping:h:1","leaseId":"S"}`},
		{"POST", "/v1/inbox/release", `{"key":"rabbit:shipping:h:1","leaseId":"S"}`},
		{"POST", "/v1/inbox/extend", `{"key":"rabbit:shipping:h:1","leaseId":"S"}`},
		{"POST", "/v1/inbox/fail", `{"key":"rabbit:shipping:h:1","leaseId":"S","dead":true}`},
		{"GET", "/v1/inbox/rabbit:shipping:h:1", ``},
		{"GET", "/v1/inbox/rabbit%3Ashipping%3Ah%3A1", ``},
	} {
		code, b, _ := call(t, h, c.method, c.path, c.body, as("billing-token-0001")...)
		want(t, fmt.Sprintf("%s %s with the billing token", c.method, c.path), code, b, 403, "error", "forbidden")
	}
	code, b, _ = call(t, h, "GET", "/v1/inbox/rabbit:shipping:h:1", "", as("admin-token-0001")...)
	want(t, "the shipping key after the refused calls", code, b, 200, "status", "InProgress")
	for _, key := range []string{"rabbit:billing:h:1", "kafka:billing:h:1"} {
		code, b, _ := call(t, h, "POST", "/v1/inbox/try-begin", fmt.Sprintf(`{"key":%q,"leaseId":"B"}`, key), as("billing-token-0001")...)
		want(t, "try-begin of "+key+" with the billing token", code, b, 200, "status", "Acquired")
		code, b, _ = call(t, h, "POST", "/v1/inbox/extend", fmt.Sprintf(`{"key":%q,"leaseId":"B"}`, key), as("billing-token-0001")...)
		want(t, "extend of "+key, code, b, 200, "status", "Extended")
		code, b, _ = call(t, h, "POST", "/v1/inbox/mark-processed", fmt.Sprintf(`{"key":%q,"leaseId":"B"}`, key), as("billing-token-0001")...)
		want(t, "mark-processed of "+key, code, b, 200, "status", "Processed")
		code, b, _ = call(t, h, "GET", "/v1/inbox/"+key, "", as("billing-token-0001")...)
		want(t, "GET of "+key, code, b, 200, "status", "Processed")
	}
	code, b, _ = call(t, h, "POST", "/v1/inbox/forget", `{"key":"rabbit:billing:h:1"}`, as("billing-token-0001")...)
	want(t, "forget with the billing token", code, b, 403, "error", "forbidden")
	code, b, _ = call(t, h, "POST", "/v1/inbox/forget", `{"key":"rabbit:shipping:h:1"}`, as("admin-token-0001")...)
	want(t, "forget with the admin's token", code, b, 200, "status", "Forgotten")

	// SetGrants changes the prefixes while serving.
	if err := h.SetGrants(server.Grant{Token: "billing-token-0001", Prefixes: []string{"rabbit:shipping:"}}); err != nil {
		t.Fatal(err)
	}
	code, b, _ = call(t, h, "GET", "/v1/inbox/rabbit:shipping:h:1", "", as("billing-token-0001")...)
	want(t, "GET after SetGrants", code, b, 200, "status", "NotFound")
	code, b, _ = call(t, h, "GET", "/v1/inbox/rabbit:billing:h:1", "", as("billing-token-0001")...)
	want(t, "GET of the old prefix after SetGrants", code, b, 403, "error", "forbidden")
	code, _, _ = call(t, h, "GET", "/v1/inbox/k", "", as("any-key-token-0001")...)
	if code != 401 {
		t.Fatalf("a token SetGrants dropped: %d, want 401", code)
	}
}

// /metrics needs a token (a consumer's or an admin's) when consumers need
// one, unless MetricsOpen; /healthz and /readyz never do; with auth none,
// /metrics is as open as the protocol.
func TestServer_metrics_need_a_token(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{Token: "consumer-token-t0k", AdminTokens: []string{"admin-token-0001"}})
	for _, hdr := range [][]string{nil, {"Authorization", "Bearer wrong"}} {
		code, b, _ := call(t, h, "GET", "/metrics", "", hdr...)
		want(t, fmt.Sprintf("/metrics with %q", hdr), code, b, 401, "error", "unauthorized")
	}
	for _, tok := range []string{"consumer-token-t0k", "admin-token-0001"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		h.ServeHTTP(rec, req)
		if rec.Code != 200 || !strings.Contains(rec.Body.String(), "inbox_server_requests_total") {
			t.Fatalf("/metrics with the token %s: %d %.200s", tok, rec.Code, rec.Body.String())
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		code, b, _ := call(t, h, "GET", path, "")
		want(t, path+" without a token", code, b, 200, "status", "OK")
	}
	for _, cfg := range []server.Config{{Token: "consumer-token-t0k", MetricsOpen: true}, {}} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.Host = "127.0.0.1:8080"
		newServer(t, cfg).ServeHTTP(rec, req)
		if rec.Code != 200 {
			t.Fatalf("/metrics without a token, config %+v: %d", cfg, rec.Code)
		}
	}
}

// A failed attempt's backoff is bounded by MaxRetryAfter (24 h by default,
// said in discovery as maxRetryAfterMs): clamped under the clamp policy,
// refused under reject, as leases are. A retry in the year 2319 is not
// granted.
func TestServer_fail_backoff_is_bounded(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{LeaseMin: time.Second})
	for i, ms := range []string{"1e300", "9223372036854775807", "86400001", "31536000000"} {
		key := fmt.Sprintf("k%d", i)
		call(t, h, "POST", "/v1/inbox/try-begin", fmt.Sprintf(`{"key":%q,"leaseId":"L"}`, key))
		code, b, _ := call(t, h, "POST", "/v1/inbox/fail", fmt.Sprintf(`{"key":%q,"leaseId":"L","retryAfterMs":%s}`, key, ms))
		want(t, "fail with retryAfterMs "+ms, code, b, 200, "status", "Released")
		_, b, _ = call(t, h, "GET", "/v1/inbox/"+key, "")
		retryAt, err := time.Parse(time.RFC3339Nano, fmt.Sprint(b["retryAt"]))
		if err != nil || time.Until(retryAt) > 24*time.Hour || time.Until(retryAt) < 23*time.Hour {
			t.Fatalf("record after a fail with retryAfterMs %s: %v, want retryAt 24 h from now", ms, b)
		}
	}
	call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"exact","leaseId":"L"}`)
	code, b, _ := call(t, h, "POST", "/v1/inbox/fail", `{"key":"exact","leaseId":"L","retryAfterMs":86400000}`)
	want(t, "fail with the longest backoff", code, b, 200, "status", "Released")

	r := newServer(t, server.Config{LeaseMin: time.Second, LeasePolicy: server.PolicyReject, MaxRetryAfter: time.Hour})
	_, b, _ = call(t, r, "GET", "/v1/inbox", "")
	want(t, "discovery", 200, b, 200, "maxRetryAfterMs", "3.6e+06")
	call(t, r, "POST", "/v1/inbox/try-begin", `{"key":"k","leaseId":"L"}`)
	for _, ms := range []string{"3600001", "1e300"} {
		code, b, _ := call(t, r, "POST", "/v1/inbox/fail", `{"key":"k","leaseId":"L","retryAfterMs":`+ms+`}`)
		want(t, "fail over the limit under reject", code, b, 400, "error", "invalid_argument")
	}
	code, b, _ = call(t, r, "POST", "/v1/inbox/fail", `{"key":"k","leaseId":"L","retryAfterMs":3600000}`)
	want(t, "fail at the limit under reject", code, b, 200, "status", "Released")
	for _, bad := range []time.Duration{-time.Second, time.Microsecond, 1500 * time.Microsecond} {
		if _, err := server.New(server.Config{Store: newMemory(t), MaxRetryAfter: bad}); !errors.Is(err, server.ErrInvalidConfig) {
			t.Errorf("MaxRetryAfter %s: %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// Invalid UTF-8 in a key is refused, not turned into U+FFFD (two keys, one
// record), and so is a body naming a member twice.
func TestServer_refuses_invalid_utf8_and_duplicate_members(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{})
	for _, body := range []string{"{\"key\":\"order:\xff\"}", `{"key":"order:\udc00"}`, `{"key":"order:1","key":"order:2"}`} {
		for _, path := range []string{"try-begin", "mark-processed"} {
			code, b, _ := call(t, h, "POST", "/v1/inbox/"+path, body)
			want(t, fmt.Sprintf("POST %s %q", path, body), code, b, 400, "error", "invalid_json")
		}
	}
	for _, key := range []string{"order:%EF%BF%BD", "order:%FF"} {
		_, b, _ := call(t, h, "GET", "/v1/inbox/"+key, "")
		if b["status"] == "Processed" {
			t.Fatalf("GET %s: %v: a refused mark reached the store", key, b)
		}
	}
}

// The configurations that would give a consumer an operator's power are
// refused.
func TestConfig_validate_tokens(t *testing.T) {
	t.Parallel()
	m := newMemory(t)
	for name, cfg := range map[string]server.Config{
		"admin token is a consumer's":  {Store: m, Token: "same-token-000001", AdminTokens: []string{"same-token-000001"}},
		"admin token is a grant's":     {Store: m, Grants: []server.Grant{{Token: "same-token-000001"}}, AdminTokens: []string{"same-token-000001"}},
		"empty admin token":            {Store: m, AdminTokens: []string{""}},
		"empty grant token":            {Store: m, Grants: []server.Grant{{Token: ""}}},
		"empty prefix":                 {Store: m, Grants: []server.Grant{{Token: "consumer-token-01", Prefixes: []string{""}}}},
		"AdminNoAuth with a token":     {Store: m, Token: "consumer-token-01", AdminNoAuth: true},
		"AdminNoAuth with admin token": {Store: m, AdminTokens: []string{"admin-token-0001"}, AdminNoAuth: true},
		"allowed host with a path":     {Store: m, AllowedHosts: []string{"inbox/x"}},
	} {
		_, err := server.New(cfg)
		if !errors.Is(err, server.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		} else if strings.Contains(err.Error(), "same-token-000001") {
			t.Errorf("%s: the error quotes a token: %v", name, err)
		}
	}
	h := newServer(t, server.Config{Token: "consumer-token-c", AdminTokens: []string{"admin-token-a-0001"}})
	if err := h.SetAdminTokens("consumer-token-c"); !errors.Is(err, server.ErrInvalidConfig) {
		t.Errorf("SetAdminTokens of a consumer's token: %v", err)
	}
	if err := h.SetTokens("admin-token-a-0001"); !errors.Is(err, server.ErrInvalidConfig) {
		t.Errorf("SetTokens of an admin's token: %v", err)
	}
	if err := newServer(t, server.Config{Token: "consumer-token-c"}).SetAdminTokens("admin-token-a-0001"); !errors.Is(err, server.ErrInvalidConfig) {
		t.Errorf("SetAdminTokens on a server without admin tokens: %v", err)
	}
	if err := h.SetAdminTokens("admin-token-a2-0001"); err != nil {
		t.Fatal(err)
	}
	code, b, _ := call(t, h, "POST", "/v1/inbox/list", `{}`, "Authorization", "Bearer admin-token-a-0001")
	want(t, "list with the replaced admin token", code, b, 401, "error", "unauthorized")
	code, _, _ = call(t, h, "POST", "/v1/inbox/list", `{}`, "Authorization", "Bearer admin-token-a2-0001")
	if code != 200 {
		t.Fatalf("list with the new admin token: %d", code)
	}
}

// Issue 30: a one-byte token was accepted, and a prefix without the
// separator reached other namespaces' keys ("app" reaches "apple:1").
// Tokens are at least MinTokenBytes and prefixes end with ':', at New and
// at every Set; the errors name the rule and never quote the token.
func TestConfig_short_tokens_and_prefixes_without_separator_are_refused(t *testing.T) {
	t.Parallel()
	m := newMemory(t)
	const long = "0123456789abcdef-long-enough"
	for name, cfg := range map[string]server.Config{
		"a one-byte Token":         {Store: m, Token: "x"},
		"a short entry of Tokens":  {Store: m, Tokens: []string{long, "short-tok"}},
		"a short grant's token":    {Store: m, Grants: []server.Grant{{Token: "short-tok"}}},
		"a short admin token":      {Store: m, AdminTokens: []string{"short-tok"}},
		"a prefix without ':'":     {Store: m, Grants: []server.Grant{{Token: long, Prefixes: []string{"app"}}}},
		"a second prefix without":  {Store: m, Grants: []server.Grant{{Token: long, Prefixes: []string{"rabbit:billing:", "kafka:billing"}}}},
		"15 bytes, one below":      {Store: m, Token: "0123456789abcde"},
		"a prefix ending in a dot": {Store: m, Grants: []server.Grant{{Token: long, Prefixes: []string{"rabbit.billing."}}}},
	} {
		_, err := server.New(cfg)
		if !errors.Is(err, server.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
			continue
		}
		if strings.Contains(err.Error(), "short-tok") || strings.Contains(err.Error(), long) {
			t.Errorf("%s: the error quotes a token: %v", name, err)
		}
		if !strings.Contains(err.Error(), "16 bytes") && !strings.Contains(err.Error(), `end with ":"`) {
			t.Errorf("%s: the error does not say the rule: %v", name, err)
		}
	}
	h := newServer(t, server.Config{Grants: []server.Grant{{Token: long, Prefixes: []string{"app:"}}}, AdminTokens: []string{"admin-" + long}})
	for name, err := range map[string]error{
		"SetTokens, short":        h.SetTokens("short-tok"),
		"SetGrants, no separator": h.SetGrants(server.Grant{Token: long, Prefixes: []string{"app"}}),
		"SetAdminTokens, short":   h.SetAdminTokens("short-tok"),
	} {
		if !errors.Is(err, server.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	// The token kept its prefix "app:", so "apple:1" stays out of reach.
	code, b, _ := call(t, h, "POST", "/v1/inbox/mark-processed", `{"key":"apple:1"}`, "Authorization", "Bearer "+long)
	want(t, "mark-processed of apple:1 with the app: token", code, b, 403, "error", "forbidden")
	code, b, _ = call(t, h, "POST", "/v1/inbox/mark-processed", `{"key":"app:1"}`, "Authorization", "Bearer "+long)
	want(t, "mark-processed of app:1 with the app: token", code, b, 200, "status", "Processed")
}

// Issue 30, finding 5: without a token, a request relayed by a proxy was
// served, and behind a reverse proxy that mode is open to the network. A
// server without tokens refuses every request that carries Forwarded or an
// X-Forwarded-* header (or X-Real-IP), but /healthz and /readyz, with 403
// and a message that says why and what to do; with tokens they are served.
func TestServer_without_token_refuses_forwarded_requests(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{AdminNoAuth: true})
	for _, hdr := range [][]string{
		{"Forwarded", "for=203.0.113.7;proto=https"},
		{"X-Forwarded-For", "203.0.113.7"},
		{"X-Forwarded-Host", "inbox.example.com"},
		{"X-Forwarded-Proto", "https"},
		{"x-forwarded-port", "443"},
		{"X-Real-Ip", "203.0.113.7"},
	} {
		for _, c := range []struct{ method, path, body string }{
			{"POST", "/v1/inbox/mark-processed", `{"key":"order:42"}`},
			{"POST", "/v1/inbox/forget", `{"key":"order:42"}`},
			{"GET", "/v1/inbox/order:42", ``},
			{"GET", "/v1/inbox", ``},
			{"GET", "/metrics", ``},
		} {
			code, b, _ := call(t, h, c.method, c.path, c.body, hdr...)
			want(t, fmt.Sprintf("%s %s with %s", c.method, c.path, hdr[0]), code, b, 403, "error", "forbidden")
			if msg, _ := b["message"].(string); !strings.Contains(msg, "proxy") || !strings.Contains(msg, "token") {
				t.Errorf("%s %s with %s: message %q does not say why and what to do", c.method, c.path, hdr[0], msg)
			}
		}
		for _, path := range []string{"/healthz", "/readyz"} {
			if code, b, _ := call(t, h, "GET", path, "", hdr...); code != 200 {
				t.Errorf("GET %s with %s: %d %v, want 200 (probes pass through proxies)", path, hdr[0], code, b)
			}
		}
	}
	if _, b, _ := call(t, h, "GET", "/v1/inbox/order:42", ""); b["status"] != "NotFound" {
		t.Fatalf("a refused request changed the key: %v", b)
	}
	ht := newServer(t, server.Config{Token: "consumer-token-t0k"})
	code, b, _ := call(t, ht, "POST", "/v1/inbox/try-begin", `{"key":"k"}`, "Authorization", "Bearer consumer-token-t0k", "X-Forwarded-For", "203.0.113.7", "Forwarded", "for=203.0.113.7")
	want(t, "a token through a proxy", code, b, 200, "status", "Acquired")
}
