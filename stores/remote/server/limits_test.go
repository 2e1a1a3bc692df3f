package server_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores/memory"
	"github.com/watermill-inbox/inbox/stores/remote/server"
)

const (
	tokenA = "tenant-a-token-000000001"
	tokenB = "tenant-b-token-000000001"
	tokenC = "tenant-b-token-rotated-01" // tenant b's prefixes: one tenant with tokenB
	admin  = "operator-token-000000001"
)

// retryAfter asserts a 429 answer's Retry-After: whole seconds, 1 to max.
func retryAfter(t *testing.T, what string, h http.Header, most time.Duration) {
	t.Helper()
	n, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil || n < 1 || time.Duration(n)*time.Second > most+time.Second {
		t.Errorf("%s: Retry-After %q, want 1 to %s in whole seconds", what, h.Get("Retry-After"), most)
	}
}

// Issue 30, finding 1: on a memory store of 50 records, one token's 60
// keys evicted another token's processed key, whose redelivery then ran
// again. With StoreCapacity, each token of its own prefixes gets a share
// of the store (here 25) and is refused (429 quota_exceeded) beyond it;
// the other token's processed key stays, and its redelivery is answered
// Processed. The tokens of one prefix set (a rotation) share one count; a
// key already counted (a duplicate) is answered as ever; a forgotten key
// frees its place.
func TestServer_live_records_per_token(t *testing.T) {
	t.Parallel()
	m, err := memory.New(memory.Options{MaxEntries: 50})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	h := newServer(t, server.Config{Store: m, StoreCapacity: 50, LeaseMin: time.Second, AdminTokens: []string{admin}, Grants: []server.Grant{
		{Token: tokenA, Prefixes: []string{"a:"}}, {Token: tokenB, Prefixes: []string{"b:"}}, {Token: tokenC, Prefixes: []string{"b:"}},
	}})
	as := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	code, b, _ := call(t, h, "POST", "/v1/inbox/mark-processed", `{"key":"a:h:1"}`, as(tokenA)...)
	want(t, "tenant a marks its key", code, b, 200, "status", "Processed")
	for i := range 25 {
		tok := tokenB
		if i%2 == 1 {
			tok = tokenC
		}
		code, b, _ := call(t, h, "POST", "/v1/inbox/mark-processed", fmt.Sprintf(`{"key":"b:h:%d"}`, i), as(tok)...)
		want(t, fmt.Sprintf("tenant b's key %d", i), code, b, 200, "status", "Processed")
	}
	for _, tok := range []string{tokenB, tokenC} {
		for _, op := range []struct{ path, body string }{
			{"/v1/inbox/mark-processed", `{"key":"b:h:25"}`},
			{"/v1/inbox/try-begin", `{"key":"b:h:26"}`},
		} {
			code, b, hdr := call(t, h, "POST", op.path, op.body, as(tok)...)
			want(t, "tenant b past its share: "+op.path, code, b, 429, "error", "quota_exceeded")
			retryAfter(t, "tenant b past its share", hdr, 8*24*time.Hour+time.Minute)
		}
	}
	// A duplicate of a counted key is no new record.
	code, b, _ = call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"b:h:3"}`, as(tokenB)...)
	want(t, "tenant b's duplicate at its share", code, b, 200, "status", "Processed")
	// Tenant a keeps its key and its own share.
	code, b, _ = call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"a:h:1","leaseId":"redelivery"}`, as(tokenA)...)
	want(t, "the redelivery of tenant a's key", code, b, 200, "status", "Processed")
	code, b, _ = call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"a:h:2"}`, as(tokenA)...)
	want(t, "tenant a's new key", code, b, 200, "status", "Acquired")
	if st := m.Stats(); st.Evicted != 0 {
		t.Errorf("the memory store evicted %d records", st.Evicted)
	}
	// Forgetting a key frees its place.
	code, _, _ = call(t, h, "POST", "/v1/inbox/forget", `{"key":"b:h:0"}`, as(admin)...)
	if code != 200 {
		t.Fatalf("forget: %d", code)
	}
	code, b, _ = call(t, h, "POST", "/v1/inbox/mark-processed", `{"key":"b:h:25"}`, as(tokenB)...)
	want(t, "tenant b after a forget", code, b, 200, "status", "Processed")
}

// The operators' records count in the store's capacity (so they evict no
// tenant's either) but in no share; with a single set of prefixes, the
// store evicts as it does without the server (no share, no capacity).
func TestServer_live_records_capacity(t *testing.T) {
	t.Parallel()
	as := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	m, err := memory.New(memory.Options{MaxEntries: 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	h := newServer(t, server.Config{Store: m, StoreCapacity: 10, AdminTokens: []string{admin}, Grants: []server.Grant{
		{Token: tokenA, Prefixes: []string{"a:"}}, {Token: tokenB, Prefixes: []string{"b:"}},
	}})
	for i := range 8 {
		code, b, _ := call(t, h, "POST", "/v1/inbox/mark-processed", fmt.Sprintf(`{"key":"ops:%d"}`, i), as(admin)...)
		want(t, "an operator's mark", code, b, 200, "status", "Processed")
	}
	for i := range 2 {
		code, b, _ := call(t, h, "POST", "/v1/inbox/mark-processed", fmt.Sprintf(`{"key":"a:%d"}`, i), as(tokenA)...)
		want(t, "tenant a within its share", code, b, 200, "status", "Processed")
	}
	code, b, hdr := call(t, h, "POST", "/v1/inbox/mark-processed", `{"key":"b:0"}`, as(tokenB)...)
	want(t, "tenant b in a full store", code, b, 429, "error", "quota_exceeded")
	retryAfter(t, "a full store", hdr, 8*24*time.Hour+time.Minute)
	if st := m.Stats(); st.Evicted != 0 {
		t.Errorf("the memory store evicted %d records", st.Evicted)
	}

	single := newServer(t, server.Config{StoreCapacity: 10, Grants: []server.Grant{{Token: tokenA, Prefixes: []string{"a:"}}}})
	for i := range 20 {
		code, b, _ := call(t, single, "POST", "/v1/inbox/mark-processed", fmt.Sprintf(`{"key":"a:%d"}`, i), as(tokenA)...)
		want(t, "the only tenant", code, b, 200, "status", "Processed")
	}
}

// flaky fails TryBegin on keys that start with "fail:".
type flaky struct{ *memory.Store }

func (f flaky) TryBegin(ctx context.Context, key string, o inbox.BeginOptions) (inbox.Claim, error) {
	if len(key) > 5 && key[:5] == "fail:" {
		return inbox.Claim{}, fmt.Errorf("%w: down", inbox.ErrStoreUnavailable)
	}
	return f.Store.TryBegin(ctx, key, o)
}

// MaxRecordsPerToken bounds each token's records on any store. A call the
// store fails counts nothing; records stop counting once they have expired
// (lease, longest backoff and retention after their last write).
func TestServer_max_records_per_token(t *testing.T) {
	t.Parallel()
	as := []string{"Authorization", "Bearer " + tokenA}
	m, err := memory.New(memory.Options{Retention: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	h := newServer(t, server.Config{Store: flaky{m}, Token: tokenA, MaxRecordsPerToken: 2, Retention: 3 * time.Second,
		LeaseMin: time.Second, LeaseMax: time.Second, LeaseDefault: time.Second, MaxRetryAfter: time.Millisecond})
	for i := range 5 {
		code, b, _ := call(t, h, "POST", "/v1/inbox/try-begin", fmt.Sprintf(`{"key":"fail:%d"}`, i), as...)
		want(t, "a try-begin the store fails", code, b, 503, "error", "store_unavailable")
	}
	for _, k := range []string{"k1", "k2"} {
		code, b, _ := call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"`+k+`"}`, as...)
		want(t, "within MaxRecordsPerToken", code, b, 200, "status", "Acquired")
	}
	code, b, hdr := call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k3"}`, as...)
	want(t, "past MaxRecordsPerToken", code, b, 429, "error", "quota_exceeded")
	retryAfter(t, "past MaxRecordsPerToken", hdr, 4*time.Second)
	testenv.Eventually(t, 30*time.Second, "k3 admitted once k1 and k2 expired", func() bool {
		code, _, _ := call(t, h, "POST", "/v1/inbox/try-begin", `{"key":"k3"}`, as...)
		return code == 200
	})
}

// RequestsPerSecond bounds each token's requests (a second's worth at
// once), 429 rate_limited with Retry-After beyond; other tokens and the
// operators' are not slowed.
func TestServer_requests_per_second_per_token(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{RequestsPerSecond: 3, AdminTokens: []string{admin}, Grants: []server.Grant{
		{Token: tokenA, Prefixes: []string{"a:"}}, {Token: tokenB, Prefixes: []string{"b:"}},
	}})
	get := func(tok, key string) (int, map[string]any, http.Header) {
		return call(t, h, "GET", "/v1/inbox/"+key, "", "Authorization", "Bearer "+tok)
	}
	limited := false
	for i := 0; i < 50 && !limited; i++ {
		code, b, hdr := get(tokenA, "a:1")
		if code == 429 {
			want(t, "tenant a over its rate", code, b, 429, "error", "rate_limited")
			retryAfter(t, "tenant a over its rate", hdr, time.Second)
			limited = true
		}
	}
	if !limited {
		t.Fatal("50 requests at once at 3 a second: none refused")
	}
	if code, b, _ := get(tokenB, "b:1"); code != 200 {
		t.Errorf("tenant b while a is limited: %d %v", code, b)
	}
	for range 10 {
		if code, b, _ := get(admin, "a:1"); code != 200 {
			t.Fatalf("an operator while a is limited: %d %v", code, b)
		}
	}
	testenv.Eventually(t, 20*time.Second, "tenant a served again", func() bool {
		code, _, _ := get(tokenA, "a:1")
		return code == 200
	})
}

// Issue 30, finding 3: failed authentications were not rate-limited. Past
// AuthFailuresPerMinute wrong tokens, an address's requests are refused
// (429, the token unchecked) until its budget refills; other addresses,
// and requests without a token, count nothing.
func TestServer_failed_authentications_are_rate_limited(t *testing.T) {
	t.Parallel()
	h := newServer(t, server.Config{Token: tokenA, AuthFailuresPerMinute: 60})
	from := func(addr, tok string) (int, map[string]any, http.Header) {
		hdr := []string{"RemoteAddr", addr}
		if tok != "" {
			hdr = append(hdr, "Authorization", "Bearer "+tok)
		}
		return call(t, h, "GET", "/v1/inbox/k", "", hdr...)
	}
	for range 20 {
		if code, _, _ := from("198.51.100.7:1000", ""); code != 401 {
			t.Fatalf("no token: %d, want 401", code)
		}
	}
	n, start := 0, time.Now()
	var blockedAt time.Time
	for ; n < 10000; n++ {
		code, b, hdr := from("198.51.100.7:1000", "guess-"+strconv.Itoa(n))
		if code == 429 {
			blockedAt = time.Now()
			want(t, "a guesser", code, b, 429, "error", "too_many_auth_failures")
			retryAfter(t, "a guesser", hdr, time.Second)
			break
		}
		if code != 401 {
			t.Fatalf("a wrong token: %d %v", code, b)
		}
	}
	// 60 failures empty the budget; it refills at one a second meanwhile.
	if most := 60 + int(time.Since(start).Seconds()) + 1; n < 60 || n > most {
		t.Fatalf("refused after %d failures, want 60 (the minute's budget) to %d (its refill since)", n, most)
	}
	// The right token from the guesser's address is refused too, unless a
	// second has passed and the budget let one more request in.
	if code, b, _ := from("198.51.100.7:1001", tokenA); code != 429 && (code != 200 || time.Since(blockedAt) < time.Second) {
		t.Errorf("the right token from the guesser's address: %d %v, want 429", code, b)
	}
	if code, b, _ := from("[2001:db8::1]:1", "guess"); code != 401 {
		t.Errorf("another address: %d %v, want 401", code, b)
	}
	if code, b, _ := from("198.51.100.8:1", tokenA); code != 200 {
		t.Errorf("another address with the token: %d %v, want 200", code, b)
	}
	testenv.Eventually(t, 20*time.Second, "the guesser's address served again", func() bool {
		code, _, _ := from("198.51.100.7:1000", tokenA)
		return code == 200
	})
	off := newServer(t, server.Config{Token: tokenA, AuthFailuresPerMinute: -1})
	for i := range 200 {
		if code, _, _ := call(t, off, "GET", "/v1/inbox/k", "", "Authorization", "Bearer guess-"+strconv.Itoa(i)); code != 401 {
			t.Fatalf("AuthFailuresPerMinute -1: %d after %d failures, want 401", code, i)
		}
	}
	if _, err := server.New(server.Config{Store: newMemory(t), RequestsPerSecond: -1}); !errors.Is(err, server.ErrInvalidConfig) {
		t.Errorf("RequestsPerSecond -1: %v", err)
	}
}
