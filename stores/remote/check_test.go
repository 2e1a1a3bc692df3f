package remote_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores"
	"github.com/watermill-inbox/inbox/stores/remote"
	"github.com/watermill-inbox/inbox/stores/remote/internal/wire"
	"github.com/watermill-inbox/inbox/stores/remote/server"
)

const wrongToken = "not-it-4c1e"

func writeToken(t *testing.T, name, token string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// closedAddr is a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// stores.Open of an http:// URL checks that the service works for this
// client: a URL that works costs two requests (discovery and one read); each
// mistake fails at Open with an error that names what to fix and never the
// token; check=false opens without a request, and the same mistake then
// fails the first call.
func TestOpen_checks_the_service(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	good := writeToken(t, "good", testToken)
	wrong := writeToken(t, "wrong", wrongToken)
	ctx := ctxT(t)

	before := r.in.total()
	s, err := stores.Open(ctx, r.base+"/?token_file="+url.QueryEscape(good))
	if err != nil {
		t.Fatalf("Open with the right token: %v", err)
	}
	defer s.Close()
	if n := r.in.total() - before; n != 2 || r.in.count("/v1/inbox") != 1 {
		t.Fatalf("Open sent %d requests (%d discovery); want 2: discovery and one read", n, r.in.count("/v1/inbox"))
	}
	mustBegin(t, s, "open-key", inbox.Acquired)
	if n := r.in.count("/v1/inbox"); n != 1 {
		t.Fatalf("%d discovery requests after Open and a call; want the one of Open", n)
	}

	html := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = io.WriteString(w, "<html>a web site</html>")
	}))
	for _, c := range []struct {
		name, url     string
		fault         func() // set on r.in for this case, cleared after it
		want          error
		names         string
		misconfigured bool
	}{
		{name: "no token", url: r.base, want: remote.ErrUnauthorized, names: "add token_file=", misconfigured: true},
		{name: "wrong token_file", url: r.base + "/?token_file=" + url.QueryEscape(wrong), want: remote.ErrUnauthorized,
			names: `refused the bearer token of token_file "` + wrong + `"`, misconfigured: true},
		{name: "wrong token=", url: r.base + "/?token=" + wrongToken, want: remote.ErrUnauthorized,
			names: "token of the store URL's token= parameter", misconfigured: true},
		{name: "wrong base URL", url: r.base + "/not/inbox/?token_file=" + url.QueryEscape(good), want: remote.ErrEndpointNotFound,
			names: "is the base URL right?", misconfigured: true},
		{name: "not an inbox service", url: html, want: remote.ErrProtocol, names: "protocol v1", misconfigured: true},
		{name: "its store down", url: r.base + "/?retries=0&token_file=" + url.QueryEscape(good), want: inbox.ErrStoreUnavailable,
			fault: func() {
				r.in.on(wire.KeyPrefix+wire.EscapeKey(remote.CheckKey), status(503, `{"error":"store_unavailable","message":"the store is unavailable"}`))
			},
			names: "HTTP 503"},
		{name: "nothing listening", url: "http://" + closedAddr(t) + "/?retries=0", want: inbox.ErrStoreUnavailable, names: "connection refused"},
	} {
		r.in.on("", nil)
		if c.fault != nil {
			c.fault()
		}
		s, err := stores.Open(ctx, c.url)
		if err == nil {
			_ = s.Close()
			t.Errorf("%s: Open succeeded", c.name)
			continue
		}
		t.Logf("%s: Open: %v", c.name, err)
		for _, target := range []error{c.want, inbox.ErrStoreUnavailable} {
			if !errors.Is(err, target) {
				t.Errorf("%s: error does not wrap %v", c.name, target)
			}
		}
		if got := errors.Is(err, stores.ErrMisconfigured); got != c.misconfigured {
			t.Errorf("%s: wraps stores.ErrMisconfigured: %v, want %v", c.name, got, c.misconfigured)
		}
		if !strings.Contains(err.Error(), c.names) {
			t.Errorf("%s: error does not say %q", c.name, c.names)
		}
		if strings.Contains(err.Error(), testToken) || strings.Contains(err.Error(), wrongToken) {
			t.Errorf("%s: error quotes a token", c.name)
		}

		lazyURL := c.url + "?check=false"
		if strings.Contains(c.url, "?") {
			lazyURL = c.url + "&check=false"
		}
		before := r.in.total()
		lazy, err := stores.Open(ctx, lazyURL)
		if err != nil {
			t.Errorf("%s: Open with check=false: %v", c.name, err)
			continue
		}
		if n := r.in.total() - before; n != 0 {
			t.Errorf("%s: Open with check=false sent %d requests", c.name, n)
		}
		_, err = lazy.Get(ctx, remote.CheckKey)
		if !errors.Is(err, c.want) || !errors.Is(err, inbox.ErrStoreUnavailable) || !strings.Contains(err.Error(), c.names) {
			t.Errorf("%s: first call after check=false: %v; want an error wrapping %v that says %q", c.name, err, c.want, c.names)
		}
		_ = lazy.Close()
	}
}

// The case: a client without its token, looping. The discovery
// failure is remembered for DiscoveryRetry, so the loop sends one discovery
// request per 5 s and no other request, whatever the number of calls.
func TestClient_without_token_sends_bounded_discovery_requests(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	c := newClient(t, remote.Options{URL: r.base})
	ctx := ctxT(t)
	calls := 0
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		_, err := c.TryBegin(ctx, "k", inbox.BeginOptions{})
		if calls == 0 || calls == 1 {
			t.Logf("call %d: %v", calls+1, err)
			checkErr(t, "TryBegin without a token", err, "GET /v1/inbox", inbox.ErrStoreUnavailable, remote.ErrUnauthorized)
			if !strings.Contains(err.Error(), "set Options.Token") {
				t.Fatalf("error %q does not say to set Options.Token", err)
			}
		}
		calls++
	}
	el := time.Since(start)
	disc, all := r.in.count("/v1/inbox"), r.in.total()
	t.Logf("%d calls in %s: %d discovery requests, %d requests in all", calls, el.Round(time.Millisecond), disc, all)
	if limit := int(el/remote.DiscoveryRetry) + 1; disc > limit || disc < 1 {
		t.Fatalf("%d discovery requests in %s; want 1 to %d (one per %s)", disc, el, limit, remote.DiscoveryRetry)
	}
	if all != disc {
		t.Fatalf("%d requests besides discovery, from a client that cannot work", all-disc)
	}

	// With a shorter interval the failure is asked again after each one: a
	// bounded refresh, not a permanent verdict.
	short := newClient(t, remote.Options{URL: r.base})
	remote.SetDiscoveryRetry(short, 50*time.Millisecond)
	base := r.in.count("/v1/inbox")
	calls = 0
	start = time.Now()
	testenv.Eventually(t, 10*time.Second, "three discovery reads", func() bool {
		for range 100 {
			_, _ = short.Get(ctx, "k")
			calls++
		}
		return r.in.count("/v1/inbox")-base >= 3
	})
	el = time.Since(start)
	disc = r.in.count("/v1/inbox") - base
	t.Logf("refresh every 50ms: %d calls in %s: %d discovery requests", calls, el.Round(time.Millisecond), disc)
	if limit := int(el/(50*time.Millisecond)) + 1; disc > limit {
		t.Fatalf("%d discovery requests in %s; want at most %d (one per 50ms)", disc, el, limit)
	}
}

// A wrong token: discovery needs none, so it is read once and kept; every
// call is refused by the service with an error that names the token's source.
func TestClient_wrong_token_names_its_source(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	c := newClient(t, remote.Options{URL: r.base, Token: wrongToken, Retries: 2})
	ctx := ctxT(t)
	calls := 0
	start := time.Now()
	for time.Since(start) < 200*time.Millisecond {
		_, err := c.TryBegin(ctx, "k", inbox.BeginOptions{})
		checkErr(t, "TryBegin with a wrong token", err, "POST /v1/inbox/try-begin", inbox.ErrStoreUnavailable, remote.ErrUnauthorized)
		if calls == 0 {
			t.Logf("call 1: %v", err)
		}
		if !strings.Contains(err.Error(), "refused the bearer token of Options.Token") || strings.Contains(err.Error(), wrongToken) {
			t.Fatalf("error %q does not name Options.Token, or quotes the token", err)
		}
		calls++
	}
	disc, tb := r.in.count("/v1/inbox"), r.in.count("/v1/inbox/try-begin")
	t.Logf("%d calls with a wrong token: %d discovery requests, %d try-begin requests", calls, disc, tb)
	if disc != 1 || tb != calls {
		t.Fatalf("%d calls sent %d discovery and %d try-begin requests; want 1 discovery and one try-begin each (a 401 is not retried)", calls, disc, tb)
	}
	nothingStored(t, r.backing, "k")
}

// A discovery answered 401 or 5xx is remembered like any failure, then asked
// again; once it succeeds it is kept.
func TestClient_remembers_failed_discovery_then_recovers(t *testing.T) {
	t.Parallel()
	for _, code := range []int{401, 503} {
		r := newRig(t, remote.Options{})
		r.in.on("/v1/inbox", status(code, `{"error":"x","message":"down"}`))
		c := newClient(t, remote.Options{URL: r.base, Token: testToken, Retries: -1})
		remote.SetDiscoveryRetry(c, 50*time.Millisecond)
		ctx := ctxT(t)
		calls := 0
		start := time.Now()
		testenv.Eventually(t, 10*time.Second, "three discovery reads", func() bool {
			for range 100 {
				_, err := c.Get(ctx, "k")
				if !errors.Is(err, inbox.ErrStoreUnavailable) {
					t.Fatalf("HTTP %d on discovery: Get = %v, want ErrStoreUnavailable", code, err)
				}
				if code == 401 && !strings.Contains(err.Error(), "Options.Token") {
					t.Fatalf("401 on discovery: %q does not name Options.Token", err)
				}
				calls++
			}
			return r.in.count("/v1/inbox") >= 3
		})
		el := time.Since(start)
		disc := r.in.count("/v1/inbox")
		t.Logf("HTTP %d on discovery: %d calls in %s: %d discovery requests, %d in all", code, calls, el.Round(time.Millisecond), disc, r.in.total())
		if limit := int(el/(50*time.Millisecond)) + 1; disc > limit || r.in.total() != disc {
			t.Fatalf("HTTP %d: %d discovery requests (%d in all) in %s; want at most %d and nothing else", code, disc, r.in.total(), el, limit)
		}
		r.in.on("", nil)
		testenv.Eventually(t, 10*time.Second, "a call once discovery answers", func() bool {
			_, err := c.Get(ctx, "k")
			return err == nil
		})
		disc = r.in.count("/v1/inbox")
		for range 50 {
			if _, err := c.Get(ctx, "k"); err != nil {
				t.Fatal(err)
			}
		}
		if n := r.in.count("/v1/inbox"); n != disc {
			t.Fatalf("HTTP %d then healed: %d more discovery requests after a successful read", code, n-disc)
		}
	}
}

// Calls waiting for the same discovery read share it; a read that ends
// because its caller gave up is not remembered.
func TestClient_discovery_read_is_shared_and_caller_cancel_not_remembered(t *testing.T) {
	t.Parallel()
	r := newRig(t, remote.Options{})
	gate := make(chan struct{})
	r.in.on("/v1/inbox", func(w http.ResponseWriter, req *http.Request, next http.Handler) {
		select {
		case <-gate:
			next.ServeHTTP(w, req)
		case <-req.Context().Done():
		}
	})
	c := newClient(t, remote.Options{URL: r.base, Token: testToken, Timeout: 10 * time.Second})

	// A caller that gives up while the read is held.
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, "k")
		gaveUp <- err
	}()
	testenv.Eventually(t, 10*time.Second, "the first discovery request", func() bool { return r.in.count("/v1/inbox") == 1 })
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("Get whose context was canceled: %v", err)
	}

	// Then many callers at once, while the next read is held.
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	callCtx := ctxT(t)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Get(callCtx, "k")
			errs <- err
		}()
	}
	testenv.Eventually(t, 10*time.Second, "the second discovery request", func() bool { return r.in.count("/v1/inbox") == 2 })
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Get after the shared read: %v", err)
		}
	}
	if n := r.in.count("/v1/inbox"); n != 2 {
		t.Fatalf("%d discovery requests; want 2: the abandoned one, then one shared by 50 callers", n)
	}
}

// Issue 30, false claim 2: a token limited to a key prefix could not
// stores.Open with the default check, which reads remote.CheckKey, outside
// the prefix, and got 403. The service answers the check's read for every
// consumer token; the token's limits hold for every other key, and for
// any write of the check key.
func TestOpen_check_passes_with_a_token_limited_to_a_prefix(t *testing.T) {
	t.Parallel()
	if remote.CheckKey != wire.CheckKey {
		t.Fatalf("remote.CheckKey %q is not the key the server lets every token read, %q", remote.CheckKey, wire.CheckKey)
	}
	const billing = "billing-token-000000000001"
	base := serve(t, server.Config{Store: newMemory(t, 0), Grants: []server.Grant{{Token: billing, Prefixes: []string{"rabbit:billing:"}}}})
	ctx := ctxT(t)
	s, err := stores.Open(ctx, base+"/?token_file="+url.QueryEscape(writeToken(t, "billing", billing)))
	if err != nil {
		t.Fatalf("Open with a token limited to rabbit:billing: %v", err)
	}
	defer s.Close()
	if c, err := s.TryBegin(ctx, "rabbit:billing:h:1", inbox.BeginOptions{}); err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin inside the prefix: %+v, %v", c, err)
	}
	if _, err := s.Get(ctx, "rabbit:shipping:h:1"); !errors.Is(err, remote.ErrUnauthorized) {
		t.Fatalf("Get outside the prefix: %v, want 403", err)
	}
	if _, err := s.TryBegin(ctx, remote.CheckKey, inbox.BeginOptions{}); !errors.Is(err, remote.ErrUnauthorized) {
		t.Fatalf("TryBegin of the check key: %v, want 403: only its read is open to every token", err)
	}
	if err := s.MarkProcessed(ctx, remote.CheckKey); !errors.Is(err, remote.ErrUnauthorized) {
		t.Fatalf("MarkProcessed of the check key: %v, want 403", err)
	}
	if _, err := stores.Open(ctx, base+"/?token="+wrongToken+"-000000"); !errors.Is(err, stores.ErrMisconfigured) {
		t.Fatalf("Open with a wrong token: %v, want a configuration error", err)
	}
}
