package remote_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/remote"
)

// The extensions fail and admin, and a client against a service without
// them.

// oldServer makes the rig's inboxd answer as a service of protocol v1
// before the fail and admin extensions: its discovery document lists
// neither, it has no fail, list, forget or force-release endpoint (404), it
// ignores acceptDead (the field of try-begin and the query of GET) and its
// answers carry no attempts, backoff, reason or retryAt.
func oldServer(w http.ResponseWriter, req *http.Request, next http.Handler) {
	switch req.URL.Path {
	case "/v1/inbox/fail", "/v1/inbox/list", "/v1/inbox/forget", "/v1/inbox/force-release":
		if req.Method == http.MethodPost {
			status(404, `{"error":"not_found","message":"no endpoint"}`)(w, req, next)
			return
		}
	case "/v1/inbox/try-begin":
		var m map[string]any
		b, _ := io.ReadAll(req.Body)
		if json.Unmarshal(b, &m) == nil {
			delete(m, "acceptDead")
			b, _ = json.Marshal(m)
		}
		req.Body = io.NopCloser(bytes.NewReader(b))
		req.ContentLength = int64(len(b))
	}
	req.URL.RawQuery = ""
	stripExt([]string{"fail", "admin"}, "attempts", "backoff", "reason", "retryAt")(w, req, next)
}

// deadKey makes key dead on the backing store directly, with one attempt.
func deadKey(t *testing.T, backing inbox.LeaseStore, key, reason string) {
	t.Helper()
	c, err := backing.TryBegin(ctxT(t), key, inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin on the backing store = %+v, %v", c, err)
	}
	if err := backing.Fail(ctxT(t), key, c.LeaseID, inbox.FailOptions{Dead: true, Reason: reason}); err != nil {
		t.Fatal(err)
	}
}

// backoffKey makes key wait out a backoff of an hour on the backing store
// directly, after one attempt.
func backoffKey(t *testing.T, backing inbox.LeaseStore, key string) {
	t.Helper()
	c, err := backing.TryBegin(ctxT(t), key, inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin on the backing store = %+v, %v", c, err)
	}
	if err := backing.Fail(ctxT(t), key, c.LeaseID, inbox.FailOptions{RetryAfter: time.Hour, Reason: "later"}); err != nil {
		t.Fatal(err)
	}
}

// A service with the fail extension from before "backoff" was added (it
// sends attempts, reason and retryAt, not backoff): a key in backoff is
// Busy with BackingOff false, so the middleware waits in-process, as on a
// live lease.
func TestClient_server_without_backoff_field(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	r.in.on("", stripExt(nil, "backoff"))
	backoffKey(t, r.backing, "k")
	b := mustBegin(t, r.client, "k", inbox.Busy)
	if b.BackingOff || b.Attempts != 1 || b.RetryAfter < 59*time.Minute {
		t.Fatalf("TryBegin of a key in backoff through a service that does not send backoff = %+v; want Busy for about an hour, 1 attempt, BackingOff false", b)
	}
}

// Against a service without the fail and admin extensions: Fail and the
// admin calls fail with ErrNotSupported naming the missing extension,
// without a request; a dead key (made so on the service's store by other
// means) is Busy to TryBegin and InProgress to Get, never a status the
// client cannot read, and never Acquired.
func TestClient_old_server_without_fail_and_admin(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	r.in.on("", oldServer)
	ctx := ctxT(t)
	c := mustBegin(t, r.client, "k", inbox.Acquired)
	if c.Attempts != 0 {
		t.Fatalf("Attempts %d from a service that does not send them, want 0", c.Attempts)
	}
	err := r.client.Fail(ctx, "k", c.LeaseID, inbox.FailOptions{RetryAfter: time.Second, Reason: "boom"})
	checkErr(t, "Fail on a service without the fail extension", err, "fail", inbox.ErrNotSupported)
	if !strings.Contains(err.Error(), "fail extension") {
		t.Fatalf("error %q does not name the missing extension", err)
	}
	if _, err := r.client.List(ctx, inbox.ListOptions{}); !errors.Is(err, inbox.ErrNotSupported) || !strings.Contains(err.Error(), "admin extension") {
		t.Fatalf("List on a service without the admin extension: %v, want ErrNotSupported naming it", err)
	}
	for name, err := range map[string]error{"Forget": r.client.Forget(ctx, "k"), "ForceRelease": r.client.ForceRelease(ctx, "k")} {
		if !errors.Is(err, inbox.ErrNotSupported) || !strings.Contains(err.Error(), "admin extension") {
			t.Fatalf("%s on a service without the admin extension: %v, want ErrNotSupported naming it", name, err)
		}
	}
	for _, path := range []string{"/v1/inbox/fail", "/v1/inbox/list", "/v1/inbox/forget", "/v1/inbox/force-release"} {
		if n := r.in.count(path); n != 0 {
			t.Fatalf("%d requests to %s, which the service does not list", n, path)
		}
	}
	if rec, _ := r.backing.Get(ctx, "k"); rec.State != inbox.StateInProgress {
		t.Fatalf("the refused calls changed the record: %+v", rec)
	}

	deadKey(t, r.backing, "dead", "poison")
	b, err := r.client.TryBegin(ctx, "dead", inbox.BeginOptions{})
	if err != nil || b.Status != inbox.Busy || b.RetryAfter <= time.Hour || b.BackingOff {
		t.Fatalf("TryBegin of a dead key through a service without the fail extension = %+v, %v; want Busy until the record expires, not BackingOff", b, err)
	}
	// A backoff (made on the service's store by other means) is Busy
	// without BackingOff: the service does not say it.
	backoffKey(t, r.backing, "backoff")
	if b := mustBegin(t, r.client, "backoff", inbox.Busy); b.BackingOff || b.RetryAfter <= 0 {
		t.Fatalf("TryBegin of a key in backoff through a service without the fail extension = %+v; want Busy, not BackingOff", b)
	}
	rec, err := r.client.Get(ctx, "dead")
	if err != nil || rec.State != inbox.StateInProgress || rec.LeaseUntil.Before(time.Now().Add(time.Hour)) {
		t.Fatalf("Get of a dead key through a service without the fail extension = %+v, %v; want InProgress until its expiry", rec, err)
	}
}

// Against a service with the extensions: Dead with its reason and
// attempts, Get's reason and retryAt, the admin calls.
func TestClient_fail_dead_and_admin(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	ctx := ctxT(t)
	c := mustBegin(t, r.client, "k", inbox.Acquired)
	if err := r.client.Fail(ctx, "k", c.LeaseID, inbox.FailOptions{RetryAfter: time.Hour, Reason: "later"}); err != nil {
		t.Fatal(err)
	}
	rec, err := r.client.Get(ctx, "k")
	if err != nil || rec.State != inbox.StateAvailable || rec.Reason != "later" || time.Until(rec.RetryAt) < 59*time.Minute {
		t.Fatalf("Get after Fail with a backoff = %+v, %v; want Available, the reason, RetryAt in an hour", rec, err)
	}
	if b := mustBegin(t, r.client, "k", inbox.Busy); b.Attempts != 1 || b.RetryAfter < 59*time.Minute || !b.BackingOff {
		t.Fatalf("TryBegin during the backoff = %+v; want Busy, BackingOff, for about an hour, 1 attempt", b)
	}
	if err := r.client.ForceRelease(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	c = mustBegin(t, r.client, "k", inbox.Acquired)
	if c.Attempts != 2 {
		t.Fatalf("Attempts %d after ForceRelease, want 2", c.Attempts)
	}
	if b := mustBegin(t, r.client, "k", inbox.Busy); b.BackingOff {
		t.Fatalf("TryBegin of the leased key = %+v; want Busy, not BackingOff", b)
	}
	if err := r.client.Fail(ctx, "k", c.LeaseID, inbox.FailOptions{Dead: true, Reason: "poison ✗"}); err != nil {
		t.Fatal(err)
	}
	d := mustBegin(t, r.client, "k", inbox.Dead)
	if d.Reason != "poison ✗" || d.Attempts != 2 {
		t.Fatalf("Dead claim %+v; want the reason and 2 attempts", d)
	}
	if rec, err := r.client.Get(ctx, "k"); err != nil || rec.State != inbox.StateDead || rec.Reason != "poison ✗" {
		t.Fatalf("Get of a dead key = %+v, %v; want Dead with the reason", rec, err)
	}
	p, err := r.client.List(ctx, inbox.ListOptions{State: inbox.StateDead})
	if err != nil || len(p.Items) != 1 || p.Items[0].Key != "k" || p.Items[0].Reason != "poison ✗" || p.Next != "" {
		t.Fatalf("List(Dead) = %+v, %v; want the dead key alone", p, err)
	}
	if err := r.client.Forget(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if c := mustBegin(t, r.client, "k", inbox.Acquired); c.Attempts != 1 {
		t.Fatalf("Attempts %d after Forget, want 1", c.Attempts)
	}
	// A second Fail with the failed lease is LeaseLost, the first time it is
	// heard.
	err = r.client.Fail(ctx, "k", "not-the-holder", inbox.FailOptions{})
	checkErr(t, "Fail by a lease that does not hold the key", err, "fail", inbox.ErrLeaseLost)
}

// loseFirst makes the first request to path lose its answer: the server
// acts on it when act is true (else it never sees it), and the connection
// is then reset.
func loseFirst(r *rig, path string, act bool) {
	var n atomic.Int32
	r.in.on(path, func(w http.ResponseWriter, req *http.Request, next http.Handler) {
		if n.Add(1) == 1 {
			if act {
				next.ServeHTTP(&capture{header: http.Header{}}, req)
			}
			hj, _ := w.(http.Hijacker)
			conn, _, _ := hj.Hijack()
			_ = conn.(*net.TCPConn).SetLinger(0)
			_ = conn.Close()
			return
		}
		next.ServeHTTP(w, req)
	})
}

// A fail whose answer was lost is retried; the retry hears LeaseLost. A
// backoff is then nil (the lease is gone either way); dead is nil only when
// the key is dead.
func TestClient_fail_after_a_lost_answer(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	ctx := ctxT(t)

	c := mustBegin(t, r.client, "backoff", inbox.Acquired)
	loseFirst(r, "/v1/inbox/fail", true)
	if err := r.client.Fail(ctx, "backoff", c.LeaseID, inbox.FailOptions{RetryAfter: time.Hour}); err != nil {
		t.Fatalf("Fail whose first answer was lost: %v, want nil", err)
	}
	if n := r.in.count("/v1/inbox/fail"); n != 2 {
		t.Fatalf("fail sent %d times, want 2 (retried)", n)
	}
	if rec, _ := r.backing.Get(ctx, "backoff"); rec.RetryAt.IsZero() {
		t.Fatalf("after the lost Fail: %+v, want the backoff", rec)
	}

	c = mustBegin(t, r.client, "dead", inbox.Acquired)
	loseFirst(r, "/v1/inbox/fail", true)
	if err := r.client.Fail(ctx, "dead", c.LeaseID, inbox.FailOptions{Dead: true, Reason: "x"}); err != nil {
		t.Fatalf("Fail with Dead whose first answer was lost: %v, want nil (the key is dead)", err)
	}

	// The lost attempt never reached the service, and the lease was ended
	// by an operator meanwhile: the key is not dead, and the caller is told.
	c = mustBegin(t, r.client, "forced", inbox.Acquired)
	if err := r.client.ForceRelease(ctx, "forced"); err != nil {
		t.Fatal(err)
	}
	loseFirst(r, "/v1/inbox/fail", false)
	err := r.client.Fail(ctx, "forced", c.LeaseID, inbox.FailOptions{Dead: true})
	checkErr(t, "Fail with Dead, lost, of a lease ended meanwhile", err, "fail", inbox.ErrLeaseLost)
	if rec, _ := r.backing.Get(ctx, "forced"); rec.State != inbox.StateAvailable {
		t.Fatalf("the key became %v", rec.State)
	}
	r.in.on("", nil)
	// forget and force-release are not retried.
	loseFirst(r, "/v1/inbox/forget", false)
	if err := r.client.Forget(ctx, "forced"); !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Fatalf("Forget whose answer was lost: %v, want ErrStoreUnavailable (not retried)", err)
	}
	if n := r.in.count("/v1/inbox/forget"); n != 1 {
		t.Fatalf("forget sent %d times, want once", n)
	}
}

// Through the middleware: a failing handler's attempt ends with Fail, so
// the redelivery waits out the backoff, and the attempt that reaches
// MaxAttempts makes the key dead: later deliveries get inbox.ErrDead
// without running the handler. Against a service without the fail
// extension the middleware releases instead.
func TestRouter_failing_handler_backoff_then_dead(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	f := startFlow(t, r.client, r.backing, func(c *inboxmw.Config, f *flow) {
		c.MaxAttempts = 2
		c.Backoff = func(int) time.Duration { return 200 * time.Millisecond }
	})
	f.fail.Store(true)
	f.publish(t, "o-5")
	testenv.Eventually(t, 20*time.Second, "the key dead after 2 attempts", func() bool {
		return f.record(t, "o-5").State == inbox.StateDead
	})
	rec := f.record(t, "o-5")
	if rec.Attempts != 2 || rec.Reason == "" || f.runs.Load() != 2 {
		t.Fatalf("dead record %+v after %d runs; want 2 attempts, 2 runs, the handler's error as the reason", rec, f.runs.Load())
	}
	if r.in.count("/v1/inbox/fail") < 2 || r.in.count("/v1/inbox/release") != 0 {
		t.Fatalf("fail sent %d times, release %d; want the attempts ended with fail", r.in.count("/v1/inbox/fail"), r.in.count("/v1/inbox/release"))
	}
	// GoChannel redelivers the nacked message: each delivery is claimed,
	// hears Dead, and never runs the handler.
	claims := r.in.count("/v1/inbox/try-begin")
	testenv.Eventually(t, 20*time.Second, "three more deliveries", func() bool { return r.in.count("/v1/inbox/try-begin") >= claims+3 })
	if n := f.runs.Load(); n != 2 {
		t.Fatalf("the handler of a dead key ran again: %d runs", n)
	}
}

func TestRouter_server_without_fail_releases(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	r.in.on("", oldServer)
	f := startFlow(t, r.client, r.backing, func(c *inboxmw.Config, f *flow) { c.MaxAttempts = 2 })
	f.fail.Store(true)
	f.publish(t, "o-6")
	testenv.Eventually(t, 20*time.Second, "the handler run 3 times", func() bool { return f.runs.Load() >= 3 })
	if rec := f.record(t, "o-6"); rec.State == inbox.StateDead || rec.State == inbox.StateProcessed {
		t.Fatalf("record %+v: a service without the fail extension cannot make a key dead", rec)
	}
	if r.in.count("/v1/inbox/release") < 2 || r.in.count("/v1/inbox/fail") != 0 {
		t.Fatalf("release sent %d times, fail %d; want releases only", r.in.count("/v1/inbox/release"), r.in.count("/v1/inbox/fail"))
	}
	f.fail.Store(false)
	testenv.Eventually(t, 20*time.Second, "processed", func() bool { return f.record(t, "o-6").State == inbox.StateProcessed })
}
