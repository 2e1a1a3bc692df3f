package remote_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
	"github.com/watermill-inbox/inbox/stores/remote"
)

// A bearer token never travels over plain http:// to a host that is not
// loopback unless the URL (or Options.Insecure) says so: such a store is
// refused at Open, before any request (the discovery request included).
// insecure is strict like every parameter: misspelled, it is refused by
// name; with https:// it is refused, since it never turns certificate
// checks off.
func TestOpen_token_over_plain_http_needs_insecure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, raw := range []string{
		"http://inbox.invalid:8080/?token=" + testToken,
		"http://inbox.invalid:8080/?token=" + testToken + "&check=false",
		"http://10.255.255.1:8080/?token=" + testToken,
		"http://[fd00::1]:8080/?token=" + testToken,
		"http://127.0.0.1.inbox.invalid/?token=" + testToken,
		"http://inbox.invalid/?token=" + testToken + "&insecure=false",
	} {
		s, err := stores.Open(ctx, raw)
		if err == nil {
			_ = s.Close()
			t.Errorf("Open(%s) succeeded: a token in clear to a remote host", raw)
			continue
		}
		if !errors.Is(err, stores.ErrInvalidURL) || errors.Is(err, inbox.ErrStoreUnavailable) ||
			!strings.Contains(err.Error(), "insecure=true") || !strings.Contains(err.Error(), "https://") {
			t.Errorf("Open(%s) = %v; want an invalid-URL error, before any connection, that says https:// or insecure=true", raw, err)
		}
		if strings.Contains(err.Error(), testToken) {
			t.Errorf("Open(%s): the error quotes the token: %v", raw, err)
		}
	}
	for raw, names := range map[string]string{
		"http://inbox.invalid/?token=" + testToken + "&insecure=ture":  "insecure",
		"http://inbox.invalid/?token=" + testToken + "&insecur=true":   "insecur",
		"http://inbox.invalid/?token=" + testToken + "&Insecure=true":  "Insecure",
		"https://inbox.invalid/?token=" + testToken + "&insecure=true": "https://",
	} {
		_, err := stores.Open(ctx, raw)
		if !errors.Is(err, stores.ErrInvalidURL) || !strings.Contains(err.Error(), names) || strings.Contains(err.Error(), testToken) {
			t.Errorf("Open(%s) = %v; want an invalid-URL error naming %s", raw, err, names)
		}
	}
	for _, raw := range []string{
		"http://inbox.invalid:8080/?token=" + testToken + "&insecure=true&check=false",
		"http://inbox.invalid:8080/?check=false", // no token: nothing secret to send
		"https://inbox.invalid:8080/?token=" + testToken + "&check=false",
		"http://localhost:1/?token=" + testToken + "&check=false",
		"http://127.0.0.2:1/?token=" + testToken + "&check=false",
		"http://[::1]:1/?token=" + testToken + "&check=false",
	} {
		s, err := stores.Open(ctx, raw)
		if err != nil {
			t.Errorf("Open(%s): %v", raw, err)
			continue
		}
		_ = s.Close()
	}
	if _, err := remote.New(remote.Options{URL: "http://inbox.invalid", Token: testToken}); !errors.Is(err, remote.ErrInvalidOptions) {
		t.Errorf("New with a token over http:// to a remote host: %v, want ErrInvalidOptions", err)
	}
	if s, err := remote.New(remote.Options{URL: "http://inbox.invalid", Token: testToken, Insecure: true}); err != nil {
		t.Errorf("New with Insecure: %v", err)
	} else {
		_ = s.Close()
	}
}

// rewrite makes the answers to path carry field=value (a JSON value), as
// a broken or hostile service would answer.
func rewrite(path, field, value string) func(http.ResponseWriter, *http.Request, http.Handler) {
	return func(w http.ResponseWriter, req *http.Request, next http.Handler) {
		if path != "" && req.URL.EscapedPath() != path {
			next.ServeHTTP(w, req)
			return
		}
		rec := &capture{header: http.Header{}}
		next.ServeHTTP(rec, req)
		var m map[string]any
		if err := json.Unmarshal(rec.body.Bytes(), &m); err != nil {
			panic(err)
		}
		var v any
		if err := json.Unmarshal([]byte(value), &v); err != nil {
			panic(err)
		}
		if items, ok := m["items"].([]any); ok && len(items) > 0 && field != "items" {
			items[0].(map[string]any)[field] = v
		} else {
			m[field] = v
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.code)
		_ = json.NewEncoder(w).Encode(m)
	}
}

// What the service answers is checked: a granted lease within the
// discovery document's range (never one that overflows time.Duration), a
// Busy wait that is not negative nor absurd, and the fields within the
// inbox contract's limits. A broken answer is ErrProtocol, naming the field
// and its value (the start of it), never the token.
func TestClient_validates_the_service_answers(t *testing.T) {
	t.Parallel()
	long := func(n int) string { return `"` + strings.Repeat("o", n) + `"` }
	for _, c := range []struct {
		path, field, value string
		call               func(ctx context.Context, r *rig, key string) error
		says               string
	}{
		{"/v1/inbox/try-begin", "leaseSeconds", "18446744074", begin, "leaseSeconds 18446744074 granted, outside [1, 9223372036]"},
		{"/v1/inbox/try-begin", "leaseSeconds", "9223372037", begin, "leaseSeconds 9223372037"},
		{"/v1/inbox/try-begin", "leaseSeconds", "121", begin, "leaseSeconds 121 granted, outside the service's range [1, 120]"},
		{"/v1/inbox/try-begin", "leaseSeconds", "-5", begin, "leaseSeconds -5"},
		{"/v1/inbox/try-begin", "leaseId", long(inbox.MaxLeaseIDLen + 1), begin, "leaseId of 129 bytes is over the limit of 128"},
		{"/v1/inbox/try-begin", "retryAfterMs", "-5", busy, "retryAfterMs -5"},
		{"/v1/inbox/try-begin", "retryAfterMs", "9223372036855", busy, "retryAfterMs 9223372036855"},
		{"/v1/inbox/try-begin", "retryAfterMs", "1e300", busy, "retryAfterMs"},
		{"/v1/inbox/try-begin", "reason", long(inbox.MaxReasonLen + 1), dead, "reason of 1025 bytes is over the limit of 1024"},
		{"/v1/inbox/extend", "leaseSeconds", "18446744074", extend, "leaseSeconds 18446744074 granted"},
		{"/v1/inbox/", "owner", long(30000), get, `owner of 30000 bytes is over the limit of 255: "ooooo`},
		{"/v1/inbox/", "reason", long(inbox.MaxReasonLen + 1), get, "reason of 1025 bytes"},
		{"/v1/inbox/", "payloadHash", long(inbox.MaxPayloadHashLen + 1), get, "payloadHash of 129 bytes"},
		{"/v1/inbox/list", "key", long(inbox.MaxKeyLen + 1), list, "item 0: key of 1025 bytes is over the limit of 1024"},
		{"/v1/inbox/list", "owner", long(inbox.MaxOwnerLen + 1), list, "owner of 256 bytes"},
		{"/v1/inbox", "leaseSeconds", `{"min":1,"max":18446744074,"default":30}`, get, "leaseSeconds {min 1, default 30, max 18446744074} is not a range"},
		{"/v1/inbox", "leaseSeconds", `{"min":30,"max":10,"default":30}`, get, "leaseSeconds {min 30, default 30, max 10} is not a range"},
		{"/v1/inbox", "maxRetryAfterMs", `-1`, get, "maxRetryAfterMs -1"},
	} {
		t.Run(c.field+"="+c.value[:min(len(c.value), 20)], func(t *testing.T) {
			t.Parallel()
			r := newRig(t, remote.Options{})
			key := "k"
			if c.path == "/v1/inbox/" {
				if err := r.backing.MarkProcessed(ctxT(t), key); err != nil {
					t.Fatal(err)
				}
			}
			if c.path != "/v1/inbox/" && c.path != "/v1/inbox" {
				r.in.on("", rewrite(c.path, c.field, c.value))
			} else if c.path == "/v1/inbox" {
				r.in.on("/v1/inbox", rewrite("", c.field, c.value))
			} else {
				r.in.on("/v1/inbox/"+key, rewrite("", c.field, c.value))
			}
			err := c.call(ctxT(t), r, key)
			checkErr(t, c.field+"="+c.value[:min(len(c.value), 20)], err, "/v1/inbox", remote.ErrProtocol, inbox.ErrStoreUnavailable)
			if err != nil && !strings.Contains(err.Error(), c.says) {
				t.Errorf("error %.300q does not say %q", err, c.says)
			}
			if err != nil && len(err.Error()) > 1000 {
				t.Errorf("error of %d bytes: the service's text is not bounded", len(err.Error()))
			}
		})
	}
}

func begin(ctx context.Context, r *rig, key string) error {
	_, err := r.client.TryBegin(ctx, key, inbox.BeginOptions{})
	return err
}

// busy makes key held by another lease, then asks for it.
func busy(ctx context.Context, r *rig, key string) error {
	if c, err := r.backing.TryBegin(ctx, key, inbox.BeginOptions{}); err != nil || c.Status != inbox.Acquired {
		return fmt.Errorf("TryBegin on the backing store: %+v, %w", c, err)
	}
	_, err := r.client.TryBegin(ctx, key, inbox.BeginOptions{})
	return err
}

func dead(ctx context.Context, r *rig, key string) error {
	c, err := r.backing.TryBegin(ctx, key, inbox.BeginOptions{})
	if err != nil {
		return err
	}
	if err := r.backing.Fail(ctx, key, c.LeaseID, inbox.FailOptions{Dead: true, Reason: "r"}); err != nil {
		return err
	}
	_, err = r.client.TryBegin(ctx, key, inbox.BeginOptions{})
	return err
}

func extend(ctx context.Context, r *rig, key string) error {
	c, err := r.backing.TryBegin(ctx, key, inbox.BeginOptions{Lease: 5 * time.Second})
	if err != nil {
		return err
	}
	_, err = r.client.Extend(ctx, key, c.LeaseID, 5*time.Second)
	return err
}

func get(ctx context.Context, r *rig, key string) error {
	_, err := r.client.Get(ctx, key)
	return err
}

func list(ctx context.Context, r *rig, key string) error {
	if err := r.backing.MarkProcessed(ctx, key); err != nil {
		return err
	}
	_, err := r.client.List(ctx, inbox.ListOptions{Prefix: key})
	return err
}

// The service's error text is quoted in the client's errors, bounded, its
// line breaks and control bytes escaped: a service cannot write lines of
// its own into the logs that quote the errors.
func TestClient_quotes_the_service_error_text(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	msg := "bad key\nlevel=ERROR msg=\"forged log line\"\x1b[31m" + strings.Repeat("x", 5000)
	body, _ := json.Marshal(map[string]string{"error": "invalid_key\nforged", "message": msg})
	for _, code := range []int{400, 401, 403, 404, 409, 503} {
		r.in.on("/v1/inbox/try-begin", status(code, string(body)))
		_, err := r.client.TryBegin(ctxT(t), "k", inbox.BeginOptions{})
		if err == nil {
			t.Fatalf("HTTP %d: no error", code)
		}
		e := err.Error()
		if strings.ContainsAny(e, "\n\r\x1b") || len(e) > 1500 || !strings.Contains(e, `"bad key\nlevel=ERROR`) || !strings.Contains(e, `"invalid_key\nforged"`) {
			t.Errorf("HTTP %d: error %.600q: want the service's text quoted (no raw line break or escape byte), bounded", code, e)
		}
	}
}

// A 403 (a consumer's token on an admin endpoint, a key outside the
// token's prefixes) says so, naming the token's source, not as a wrong
// token.
func TestClient_forbidden_says_what_the_token_may_not_do(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	r.in.on("/v1/inbox/forget", status(403, `{"error":"forbidden","message":"this endpoint needs an admin token; the bearer token is a consumer's"}`))
	err := r.client.Forget(ctxT(t), "k")
	checkErr(t, "Forget with a consumer's token", err, "/v1/inbox/forget", remote.ErrUnauthorized, inbox.ErrStoreUnavailable)
	if err != nil && (!strings.Contains(err.Error(), "may not make this call") || strings.Contains(err.Error(), "refused the bearer token")) {
		t.Errorf("error %q: want it to say the token may not make this call", err)
	}
}

// hostile makes the service's answers carry, per path, the fields given
// (JSON values; "" removes the field), as a hostile service would.
func hostile(fields map[string]map[string]string) func(http.ResponseWriter, *http.Request, http.Handler) {
	return func(w http.ResponseWriter, req *http.Request, next http.Handler) {
		rec := &capture{header: http.Header{}}
		next.ServeHTTP(rec, req)
		var m map[string]any
		if err := json.Unmarshal(rec.body.Bytes(), &m); err != nil {
			panic(err)
		}
		for f, v := range fields[req.URL.EscapedPath()] {
			if v == "" {
				delete(m, f)
				continue
			}
			var x any
			if err := json.Unmarshal([]byte(v), &x); err != nil {
				panic(err)
			}
			m[f] = x
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.code)
		_ = json.NewEncoder(w).Encode(m)
	}
}

// Issue 30, finding 2: the client bounded retryAfterMs but not a wait
// computed from expiresAt (Busy with expiresAt in the year 9999 made a
// 292-year backoff), and a discovery document could raise its limits as
// far. Whatever the service says, the client believes no wait longer than
// remote.MaxRetryAfter and no lease longer than remote.MaxLease.
func TestClient_bounds_every_wait_and_lease_by_its_own_maxima(t *testing.T) {
	t.Parallel()
	const far = `"9999-12-31T23:59:59Z"`
	const maxMillis, maxSeconds = "9223372036854", "9223372036" // what a time.Duration holds
	discovery := map[string]string{"leaseSeconds": `{"min":1,"default":30,"max":` + maxSeconds + `}`, "maxRetryAfterMs": maxMillis}
	for name, c := range map[string]map[string]string{
		"Busy without retryAfterMs, expiresAt in 9999": {"expiresAt": far, "retryAfterMs": ""},
		"Busy with a retryAfterMs of 292 years":        {"retryAfterMs": maxMillis},
	} {
		r := newRig(t, remote.Options{})
		r.in.on("", hostile(map[string]map[string]string{"/v1/inbox": discovery, "/v1/inbox/try-begin": c}))
		ctx := ctxT(t)
		if _, err := r.backing.TryBegin(ctx, "k", inbox.BeginOptions{}); err != nil {
			t.Fatal(err)
		}
		cl, err := r.client.TryBegin(ctx, "k", inbox.BeginOptions{})
		if err != nil || cl.Status != inbox.Busy {
			t.Fatalf("%s: %+v, %v, want Busy", name, cl, err)
		}
		if cl.RetryAfter <= 0 || cl.RetryAfter > remote.MaxRetryAfter || cl.ExpiresAt.After(time.Now().Add(remote.MaxRetryAfter)) {
			t.Errorf("%s: RetryAfter %s, ExpiresAt %s; want at most %s from now", name, cl.RetryAfter, cl.ExpiresAt, remote.MaxRetryAfter)
		}
		d, err := r.client.Discover(ctx)
		if err != nil || d.LeaseMax > remote.MaxLease || d.LeaseDefault > remote.MaxLease || d.MaxRetryAfter > remote.MaxRetryAfter {
			t.Errorf("%s: discovery %+v, %v; want its lease range within %s and its backoff within %s", name, d, err, remote.MaxLease, remote.MaxRetryAfter)
		}
	}
	r := newRig(t, remote.Options{})
	r.in.on("", hostile(map[string]map[string]string{
		"/v1/inbox":           discovery,
		"/v1/inbox/try-begin": {"leaseSeconds": maxSeconds, "expiresAt": far},
		"/v1/inbox/extend":    {"leaseSeconds": maxSeconds, "expiresAt": far},
	}))
	ctx := ctxT(t)
	cl, err := r.client.TryBegin(ctx, "k", inbox.BeginOptions{})
	if err != nil || cl.Status != inbox.Acquired {
		t.Fatalf("TryBegin: %+v, %v, want Acquired", cl, err)
	}
	if cl.Lease <= 0 || cl.Lease > remote.MaxLease || cl.ExpiresAt.After(time.Now().Add(remote.MaxLease)) {
		t.Errorf("a granted lease of 292 years: Lease %s, ExpiresAt %s; want at most %s", cl.Lease, cl.ExpiresAt, remote.MaxLease)
	}
	exp, err := r.client.Extend(ctx, "k", cl.LeaseID, time.Minute)
	if err != nil || exp.After(time.Now().Add(remote.MaxLease)) {
		t.Errorf("an extension to the year 9999: %s, %v; want at most %s from now", exp, err, remote.MaxLease)
	}
}
