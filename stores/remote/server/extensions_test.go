package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/memory"
	"github.com/watermill-inbox/inbox/stores/remote/server"
)

// The fail and admin extensions.

func TestServer_discovery_lists_fail_and_admin(t *testing.T) {
	t.Parallel()
	for _, cfg := range []server.Config{{AdminNoAuth: true}, {AdminTokens: []string{"admin-token-0001"}}, {Token: "consumer-token-01", AdminTokens: []string{"admin-token-0001"}}} {
		_, b, _ := call(t, newServer(t, cfg), "GET", "/v1/inbox", "")
		if got := fmt.Sprint(b["extensions"]); got != "[extend leaseId payloadHash payloadMismatch fail admin]" || b["maxRetryAfterMs"] != 86400000.0 {
			t.Fatalf("discovery %v: want the extensions with admin, and maxRetryAfterMs 24 h", b)
		}
	}
	// No admin token and not AdminNoAuth: the admin endpoints are off.
	for _, cfg := range []server.Config{{}, {Token: "consumer-token-01"}} {
		h := newServer(t, cfg)
		_, b, _ := call(t, h, "GET", "/v1/inbox", "")
		if got := fmt.Sprint(b["extensions"]); got != "[extend leaseId payloadHash payloadMismatch fail]" {
			t.Fatalf("extensions without an admin token: %s", got)
		}
		for _, path := range []string{"list", "forget", "force-release"} {
			code, b, _ := call(t, h, "POST", "/v1/inbox/"+path, `{"key":"k"}`, "Authorization", "Bearer consumer-token-01")
			want(t, path+" without an admin token", code, b, 403, "error", "forbidden")
		}
	}
	// A store without inbox.Admin: no admin extension, and its endpoints
	// answer 501.
	h := newServer(t, server.Config{Store: plain{newMemory(t)}, AdminNoAuth: true})
	var b map[string]any
	_, b, _ = call(t, h, "GET", "/v1/inbox", "")
	if got := fmt.Sprint(b["extensions"]); got != "[extend leaseId payloadHash payloadMismatch fail]" {
		t.Fatalf("extensions over a store without Admin: %s", got)
	}
	for _, path := range []string{"list", "forget", "force-release"} {
		code, b, _ := call(t, h, "POST", "/v1/inbox/"+path, `{"key":"k"}`)
		want(t, path+" over a store without Admin", code, b, 501, "error", "not_supported")
	}
}

// plain hides the memory store's Admin methods.
type plain struct{ inbox.LeaseStore }

func TestServer_fail_backoff_and_dead(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{LeaseMin: time.Second, AdminNoAuth: true})
	code, b, _ := call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k","leaseId":"L1","owner":"o"}`)
	want(t, "try-begin", code, b, 200, "status", "Acquired")
	if b["attempts"] != 1.0 {
		t.Fatalf("Acquired answer %v, want attempts 1", b)
	}
	code, b, _ = call(t, h, "POST", "/v1/inbox/fail", `{"key":"k","leaseId":"L1","retryAfterMs":60000,"reason":"boom"}`)
	want(t, "fail with a backoff", code, b, 200, "status", "Released")
	code, b, _ = call(t, h, "POST", "/v1/inbox/fail", `{"key":"k","leaseId":"L1"}`)
	want(t, "fail repeated", code, b, 200, "status", "LeaseLost")
	code, b, _ = call(t, h, "GET", "/v1/inbox/k", "")
	want(t, "get during the backoff", code, b, 200, "status", "Available")
	retryAt, err := time.Parse(time.RFC3339Nano, fmt.Sprint(b["retryAt"]))
	if err != nil || b["reason"] != "boom" || time.Until(retryAt) < 50*time.Second {
		t.Fatalf("record during the backoff %v: want reason boom and retryAt in a minute", b)
	}
	code, b, _ = call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k","leaseId":"L1","acceptDead":true}`)
	want(t, "try-begin during the backoff", code, b, 200, "status", "Busy")
	if ms, _ := b["retryAfterMs"].(float64); ms < 50000 || ms > 60000 || b["attempts"] != 1.0 || b["expiresAt"] == nil || b["backoff"] != true {
		t.Fatalf("Busy during the backoff %v: want retryAfterMs within a minute, attempts 1, expiresAt, backoff true", b)
	}
	code, b, _ = call(t, h, "POST", "/v1/inbox/force-release", `{"key":"k"}`)
	want(t, "force-release of a backoff", code, b, 200, "status", "Released")
	code, b, _ = call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k","leaseId":"L2"}`)
	want(t, "try-begin after force-release", code, b, 200, "status", "Acquired")
	for _, body := range []string{`{"key":"k","leaseId":"L1","acceptDead":true}`, `{"key":"k"}`} {
		code, b, _ = call(t, h, "POST", "/v1/inbox/try-begin", body)
		want(t, "try-begin of a leased key", code, b, 200, "status", "Busy")
		if _, ok := b["backoff"]; ok || b["retryAfterMs"] == nil {
			t.Fatalf("Busy on a live lease %v: want retryAfterMs and no backoff", b)
		}
	}
	code, b, _ = call(t, h, "POST", "/v1/inbox/fail", `{"key":"k","leaseId":"L2","dead":true,"retryAfterMs":5,"reason":"poison"}`)
	want(t, "fail dead", code, b, 200, "status", "Dead")
	if len(b) != 1 {
		t.Fatalf("fail answer %v carries more than its status", b)
	}

	code, b, _ = call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k","acceptDead":true}`)
	want(t, "try-begin of a dead key with acceptDead", code, b, 200, "status", "Dead")
	if b["reason"] != "poison" || b["attempts"] != 2.0 || b["leaseId"] != nil || b["expiresAt"] != nil {
		t.Fatalf("Dead answer %v: want reason poison, attempts 2, no lease", b)
	}
	code, b, _ = call(t, h, "GET", "/v1/inbox/k?acceptDead=true", "")
	want(t, "get of a dead key with acceptDead", code, b, 200, "status", "Dead")
	if b["reason"] != "poison" || b["leaseUntil"] != nil || b["retryAt"] != nil {
		t.Fatalf("dead record %v", b)
	}
	lastSeen, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(b["lastSeen"]))

	// A client that does not say it reads Dead: Busy, and InProgress,
	// until the record expires (the Fail plus the retention).
	expiry := lastSeen.Add(inbox.DefaultRetention)
	for _, body := range []string{`{"key":"k"}`, `{"key":"k","acceptDead":false}`} {
		code, b, _ = call(t, h, "POST", "/v1/inbox/try-begin", body)
		want(t, "try-begin of a dead key without acceptDead", code, b, 200, "status", "Busy")
		exp, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(b["expiresAt"]))
		ms, _ := b["retryAfterMs"].(float64)
		if !exp.Equal(expiry) || time.Duration(ms)*time.Millisecond < inbox.DefaultRetention-time.Minute || b["reason"] != nil || b["leaseId"] != nil || b["backoff"] != nil {
			t.Fatalf("Busy answer %v for a dead key: want expiresAt %s (the Fail plus the retention), retryAfterMs until then, no reason, no backoff", b, expiry)
		}
	}
	for _, target := range []string{"/v1/inbox/k", "/v1/inbox/k?acceptDead=false", "/v1/inbox/k?acceptDead=maybe"} {
		code, b, _ = call(t, h, "GET", target, "")
		want(t, "GET "+target, code, b, 200, "status", "InProgress")
		if until, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(b["leaseUntil"])); !until.Equal(expiry) {
			t.Fatalf("GET %s = %v, want leaseUntil %s", target, b, expiry)
		}
	}
	code, b, _ = call(t, h, "POST", "/v1/inbox/force-release", `{"key":"k"}`)
	want(t, "force-release of a dead key", code, b, 200, "status", "Released")
	code, b, _ = call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k","acceptDead":true}`)
	want(t, "still dead after force-release", code, b, 200, "status", "Dead")
	code, b, _ = call(t, h, "POST", "/v1/inbox/forget", `{"key":"k"}`)
	want(t, "forget", code, b, 200, "status", "Forgotten")
	code, b, _ = call(t, h, "POST", "/v1/inbox/forget", `{"key":"k"}`)
	want(t, "forget of an unknown key", code, b, 200, "status", "Forgotten")
	code, b, _ = call(t, h, "POST", "/v1/inbox/force-release", `{"key":"never"}`)
	want(t, "force-release of an unknown key", code, b, 200, "status", "Released")
	code, b, _ = call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k"}`)
	want(t, "try-begin after forget", code, b, 200, "status", "Acquired")
	if b["attempts"] != 1.0 {
		t.Fatalf("after forget: %v, want a new record", b)
	}
}

// A dead record that outlives the retention the server was told (its
// store's is longer) is Busy for a second at a time to an old client.
func TestServer_dead_key_past_the_configured_retention(t *testing.T) {
	t.Parallel()
	// A nanosecond: over by the next request; the store's is 7 days.
	h := newServer(t, server.Config{Retention: time.Nanosecond})
	call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k","leaseId":"L"}`)
	call(t, h, "POST", "/v1/inbox/fail", `{"key":"k","leaseId":"L","dead":true}`)
	code, b, _ := call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k"}`)
	want(t, "try-begin", code, b, 200, "status", "Busy")
	if ms, _ := b["retryAfterMs"].(float64); ms < 1 || ms > 1000 {
		t.Fatalf("Busy %v, want retryAfterMs within a second", b)
	}
	if _, err := server.New(server.Config{Store: newMemory(t), Retention: -time.Second}); err == nil {
		t.Fatal("a negative Retention was accepted")
	}
}

func TestServer_list(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{AdminNoAuth: true})
	for _, k := range []string{"p:a", "p:b", "p:c", "q:a"} {
		code, _, _ := call(t, h, "POST", "/v1/inbox/mark-processed", fmt.Sprintf(`{"key":%q}`, k))
		if code != 200 {
			t.Fatal(code)
		}
	}
	call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"p:d","leaseId":"L","owner":"me"}`)
	call(t, h, "POST", "/v1/inbox/fail", `{"key":"p:d","leaseId":"L","dead":true,"reason":"bad"}`)

	code, b, _ := call(t, h, "POST", "/v1/inbox/list", `{"prefix":"p:","limit":2}`)
	want(t, "list page 1", code, b, 200, "next", "p:b")
	items := b["items"].([]any)
	if len(items) != 2 || items[0].(map[string]any)["key"] != "p:a" || items[0].(map[string]any)["status"] != "Processed" {
		t.Fatalf("page 1 %v", b)
	}
	code, b, _ = call(t, h, "POST", "/v1/inbox/list", `{"prefix":"p:","limit":2,"cursor":"p:b"}`)
	want(t, "list page 2", code, b, 200, "next", "")
	items = b["items"].([]any)
	last := items[len(items)-1].(map[string]any)
	if len(items) != 2 || last["key"] != "p:d" || last["status"] != "Dead" || last["reason"] != "bad" || last["owner"] != "me" ||
		last["attempts"] != 1.0 || last["firstSeen"] == nil || last["lastSeen"] == nil {
		t.Fatalf("page 2 %v: want p:c, then p:d dead with its fields", b)
	}
	code, b, _ = call(t, h, "POST", "/v1/inbox/list", `{"state":"Dead"}`)
	if items := b["items"].([]any); code != 200 || len(items) != 1 {
		t.Fatalf("list of dead keys: %d %v", code, b)
	}
	code, b, _ = call(t, h, "POST", "/v1/inbox/list", `{"olderThanMs":3600000}`)
	if items := b["items"].([]any); code != 200 || len(items) != 0 {
		t.Fatalf("list of keys older than an hour: %d %v, want none (an empty array)", code, b)
	}
	code, b, _ = call(t, h, "POST", "/v1/inbox/list", `{}`)
	if items := b["items"].([]any); code != 200 || len(items) != 5 {
		t.Fatalf("list of everything: %d %v", code, b)
	}
}

func TestServer_fail_and_admin_bad_input(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{MaxKeyBytes: 10, AdminNoAuth: true})
	long := strings.Repeat("r", inbox.MaxReasonLen+1)
	for _, c := range []struct{ path, body, code string }{
		{"fail", `{`, "invalid_json"},
		{"fail", `{"leaseId":"L"}`, "invalid_key"},
		{"fail", `{"key":"01234567890","leaseId":"L"}`, "invalid_key"},
		{"fail", `{"key":"k"}`, "invalid_lease_id"},
		{"fail", `{"key":"k","leaseId":""}`, "invalid_lease_id"},
		{"fail", `{"key":"k","leaseId":"L","retryAfterMs":-1}`, "invalid_argument"},
		{"fail", `{"key":"k","leaseId":"L","retryAfterMs":1.5}`, "invalid_argument"},
		{"fail", `{"key":"k","leaseId":"L","retryAfterMs":"5"}`, "invalid_argument"},
		{"fail", `{"key":"k","leaseId":"L","dead":"yes"}`, "invalid_argument"},
		{"fail", `{"key":"k","leaseId":"L","reason":"` + long + `"}`, "invalid_argument"},
		{"fail", `{"key":"k","leaseId":"L","reason":"a\u0000b"}`, "invalid_argument"},
		{"fail", `{"key":"k","leaseId":"L","reason":7}`, "invalid_argument"},
		{"list", `[]`, "invalid_json"},
		{"list", `{"state":"Sleeping"}`, "invalid_argument"},
		{"list", `{"state":"NotFound"}`, "invalid_argument"},
		{"list", `{"state":3}`, "invalid_argument"},
		{"list", `{"limit":1001}`, "invalid_argument"},
		{"list", `{"limit":-1}`, "invalid_argument"},
		{"list", `{"limit":2.5}`, "invalid_argument"},
		{"list", `{"olderThanMs":-5}`, "invalid_argument"},
		{"list", `{"prefix":"a\u0000"}`, "invalid_argument"},
		{"forget", `{}`, "invalid_key"},
		{"forget", `{"key":""}`, "invalid_key"},
		{"forget", `{"key":"01234567890"}`, "invalid_key"},
		{"force-release", `{"key":5}`, "invalid_key"},
		{"force-release", `null`, "invalid_json"},
	} {
		code, b, _ := call(t, h, "POST", "/v1/inbox/"+c.path, c.body)
		if code != 400 || b["error"] != c.code || b["message"] == "" {
			t.Errorf("POST %s %.80s = %d %v, want 400 %s with a message", c.path, c.body, code, b, c.code)
		}
	}
	// A GET of a key named like an operation is the key; another method on
	// it says to use POST.
	h = newServer(t, server.Config{})
	for _, path := range []string{"fail", "list", "forget", "force-release"} {
		code, b, _ := call(t, h, "GET", "/v1/inbox/"+path, "")
		want(t, "GET of the key "+path, code, b, 200, "status", "NotFound")
		code, b, hdr := call(t, h, "PUT", "/v1/inbox/"+path, `{}`)
		want(t, "PUT "+path, code, b, 405, "error", "method_not_allowed")
		if hdr.Get("Allow") != "GET, HEAD, POST" {
			t.Errorf("PUT %s: Allow %q", path, hdr.Get("Allow"))
		}
	}
}

// fail needs a consumer's token (or an admin's); the admin endpoints an
// admin's: a consumer's token is answered 403 there.
func TestServer_fail_and_admin_need_the_token(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{Token: "consumer-token-t0k", AdminTokens: []string{"admin-token-adm1n"}})
	for path, body := range map[string]string{
		"fail": `{"key":"k","leaseId":"L"}`, "list": `{}`, "forget": `{"key":"k"}`, "force-release": `{"key":"k"}`,
	} {
		admin := path != "fail"
		code, b, _ := call(t, h, "POST", "/v1/inbox/"+path, body)
		want(t, path+" without the token", code, b, 401, "error", "unauthorized")
		code, b, _ = call(t, h, "POST", "/v1/inbox/"+path, body, "Authorization", "Bearer wrong")
		want(t, path+" with a wrong token", code, b, 401, "error", "unauthorized")
		code, b, _ = call(t, h, "POST", "/v1/inbox/"+path, body, "Authorization", "Bearer consumer-token-t0k")
		if admin {
			want(t, path+" with a consumer's token", code, b, 403, "error", "forbidden")
		} else if code != http.StatusOK {
			t.Errorf("%s with the consumer's token: %d", path, code)
		}
		code, _, _ = call(t, h, "POST", "/v1/inbox/"+path, body, "Authorization", "Bearer admin-token-adm1n")
		if code != http.StatusOK {
			t.Errorf("%s with the admin's token: %d", path, code)
		}
	}
}

// The discovery document announces the store's retention when the server
// knows it: set in Config.Retention, or reported by the store.
func TestServer_discovery_announces_the_retention_when_known(t *testing.T) {
	t.Parallel()
	short, err := memory.New(memory.Options{Retention: 90 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = short.Close() })
	for _, c := range []struct {
		what string
		cfg  server.Config
		want any
	}{
		{"a store with the default retention", server.Config{}, float64(7 * 24 * 3600)},
		{"a store of 90 minutes", server.Config{Store: short}, float64(5400)},
		{"Config.Retention over a store that does not report one", server.Config{Store: plain{newMemory(t)}, Retention: 2 * time.Hour}, float64(7200)},
		{"a store that does not report one", server.Config{Store: plain{newMemory(t)}}, nil},
	} {
		_, b, _ := call(t, newServer(t, c.cfg), "GET", "/v1/inbox", "")
		if b["retentionSeconds"] != c.want {
			t.Errorf("%s: retentionSeconds %v, want %v", c.what, b["retentionSeconds"], c.want)
		}
	}
}
