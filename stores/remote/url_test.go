package remote_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores"
	"github.com/watermill-inbox/inbox/stores/remote"
	"github.com/watermill-inbox/inbox/stores/remote/server"
	"github.com/watermill-inbox/inbox/stores/storetest"
)

func TestOpenURL(t *testing.T) {
	t.Parallel()
	base := serve(t, server.Config{Store: newMemory(t, 0), Token: testToken})
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("  "+testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := stores.Open(ctx, base+"/?token_file="+url.QueryEscape(file)+"&timeout=1s&retries=0&lease=5s")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := s.TryBegin(ctx, "k", inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Acquired || c.Lease != 5*time.Second {
		t.Fatalf("TryBegin through a URL-opened store: %+v, %v; want the URL's 5s lease", c, err)
	}
	s2, err := stores.Open(ctx, base+"?token="+testToken)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, err := s2.Get(ctx, "k"); err != nil {
		t.Fatalf("token in the URL: %v", err)
	}

	for raw, want := range map[string]string{
		base + "/?retention=1h":                      "retention",
		base + "/?token=" + testToken + "&bogus=1":   "bogus",
		base + "/?token=a&token_file=" + file:        "not both",
		base + "/?token_file=/nonexistent/tok":       "token_file",
		base + "/?retries=-1":                        "retries",
		base + "/?timeout=fast":                      "timeout",
		"http://user:" + testToken + "@127.0.0.1:1/": "user info",
		"http:///nohost":                             "no host",
		base + "/#frag":                              "fragment",
	} {
		_, err := stores.Open(ctx, raw)
		if !errors.Is(err, stores.ErrInvalidURL) || !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%s): %v, want ErrInvalidURL naming %q", stores.Redact(mustParse(t, raw)), err, want)
		}
		if err != nil && strings.Contains(err.Error(), testToken) {
			t.Errorf("Open error quotes the token: %v", err)
		}
	}
}

func mustParse(t *testing.T, raw string) *url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestOptions_validate(t *testing.T) {
	t.Parallel()
	for name, o := range map[string]remote.Options{
		"no URL":        {},
		"ftp":           {URL: "ftp://h"},
		"query":         {URL: "http://h/?x=1"},
		"token newline": {URL: "http://h", Token: "a\nb"},
		"negative":      {URL: "http://h", Timeout: -time.Second},
		"lease":         {URL: "http://h", Lease: -time.Second},
		"tiny answers":  {URL: "http://h", MaxResponseBytes: 10},
	} {
		if _, err := remote.New(o); !errors.Is(err, remote.ErrInvalidOptions) || !errors.Is(err, inbox.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidOptions", name, err)
		}
	}
}

// The client logs its retries; the token never appears.
func TestClient_logs_never_hold_the_token(t *testing.T) {
	t.Parallel()
	logs := watermill.NewCaptureLogger()
	r := newRig(t, remote.Options{Logger: logs})
	r.in.on("/v1/inbox/mark-processed", status(503, `{"error":"store_unavailable","message":"x"}`))
	err := r.client.Complete(context.Background(), "k", "l")
	checkErr(t, "Complete answered 503", err, "mark-processed", inbox.ErrStoreUnavailable)
	n := 0
	for _, entries := range logs.Captured() {
		for _, e := range entries {
			n++
			if strings.Contains(e.Msg+strings.Join(fieldValues(e.Fields), " "), testToken) {
				t.Fatalf("log entry holds the token: %+v", e)
			}
		}
	}
	if n != 2 {
		t.Fatalf("%d log entries for 2 retries", n)
	}
}

func fieldValues(f watermill.LogFields) []string {
	var out []string
	for k, v := range f {
		out = append(out, k, strings.TrimSpace(strings.ReplaceAll(fmtAny(v), "\n", " ")))
	}
	return out
}

func fmtAny(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	if e, ok := v.(error); ok {
		return e.Error()
	}
	return ""
}

// The suite against a server whose discovery omits the extend extension:
// Extend must fail with ErrNotSupported and everything else still holds.
func TestConformance_memory_without_extend(t *testing.T) {
	h := harness(func(t *testing.T, cfg storetest.Config) inbox.LeaseStore { return newMemory(t, cfg.Retention) })
	h.New = func(t *testing.T, cfg storetest.Config) inbox.LeaseStore {
		sh, err := server.New(server.Config{Store: newMemory(t, cfg.Retention), LeaseMin: time.Second, AdminNoAuth: true})
		if err != nil {
			t.Fatal(err)
		}
		in := &injector{next: sh}
		in.on("/v1/inbox", strip())
		return newClient(t, remote.Options{URL: serveHandler(t, in)})
	}
	h.NoExtend = true
	storetest.Run(t, h)
}

// The lease granted is the server's answer: clamped into its range, or
// refused under the reject policy; leases travel in whole seconds, rounded up.
func TestClient_lease_granted_by_server(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clamp := newClient(t, remote.Options{URL: serve(t, server.Config{Store: newMemory(t, 0), LeaseMin: 30 * time.Second})})
	for asked, granted := range map[time.Duration]time.Duration{
		5 * time.Second: 30 * time.Second, 45*time.Second + time.Millisecond: 46 * time.Second, time.Hour: 120 * time.Second,
	} {
		c, err := clamp.TryBegin(ctx, "k"+asked.String(), inbox.BeginOptions{Lease: asked})
		if err != nil || c.Lease != granted {
			t.Errorf("asked %s: granted %s, %v; want %s", asked, c.Lease, err, granted)
		}
	}
	// A client without Options.Lease asks for none: the service grants its
	// own default, not the client's.
	dflt := newClient(t, remote.Options{URL: serve(t, server.Config{Store: newMemory(t, 0), LeaseDefault: 50 * time.Second})})
	if c, err := dflt.TryBegin(ctx, "k", inbox.BeginOptions{}); err != nil || c.Status != inbox.Acquired || c.Lease != 50*time.Second {
		t.Errorf("TryBegin without a lease = %+v, %v; want Acquired with the service's 50s default", c, err)
	}
	reject := newClient(t, remote.Options{URL: serve(t, server.Config{Store: newMemory(t, 0), LeaseMin: 30 * time.Second, LeasePolicy: server.PolicyReject})})
	_, err := reject.TryBegin(ctx, "k", inbox.BeginOptions{Lease: 5 * time.Second})
	checkErr(t, "a lease under the minimum with reject", err, "try-begin", inbox.ErrInvalidLease, inbox.ErrInvalidArgument)
	if !strings.Contains(err.Error(), "[30, 120]") {
		t.Fatalf("error %q does not state the server's range", err)
	}
}

// Issue 30, finding 6: the remote store URL had no way to name a private
// CA. ca_file=<PEM file> makes the client trust the CAs it holds (and only
// them) for https://; a certificate they did not sign fails Open as a
// mistake of configuration that names ca_file.
func TestOpenURL_ca_file_trusts_a_private_CA(t *testing.T) {
	t.Parallel()
	certFile, keyFile, _ := testenv.SelfSignedCert(t, t.TempDir())
	otherCA, _, _ := testenv.SelfSignedCert(t, t.TempDir())
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	h, err := server.New(server.Config{Store: newMemory(t, 0), Token: testToken, LeaseMin: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ctx := ctxT(t)
	s, err := stores.Open(ctx, srv.URL+"/?token="+testToken+"&ca_file="+url.QueryEscape(certFile))
	if err != nil {
		t.Fatalf("Open with ca_file naming the server's CA: %v", err)
	}
	defer s.Close()
	if c, err := s.TryBegin(ctx, "ca:k", inbox.BeginOptions{}); err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin over https with ca_file: %+v, %v", c, err)
	}
	for name, raw := range map[string]string{
		"no ca_file":      srv.URL + "/?token=" + testToken + "&timeout=5s",
		"another CA file": srv.URL + "/?token=" + testToken + "&timeout=5s&ca_file=" + url.QueryEscape(otherCA),
	} {
		_, err := stores.Open(ctx, raw)
		if !errors.Is(err, stores.ErrMisconfigured) || !strings.Contains(err.Error(), "ca_file") || strings.Contains(err.Error(), testToken) {
			t.Errorf("%s: Open = %v, want a configuration error that names ca_file", name, err)
		}
	}
	plain := serve(t, server.Config{Store: newMemory(t, 0), Token: testToken})
	if _, err := stores.Open(ctx, strings.Replace(plain, "http://", "https://", 1)+"/?token="+testToken+"&ca_file="+url.QueryEscape(certFile)); !errors.Is(err, stores.ErrMisconfigured) || !strings.Contains(err.Error(), "does not answer in TLS") {
		t.Errorf("https:// to a plain HTTP service: Open = %v, want a configuration error that says it does not answer in TLS", err)
	}
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for raw, want := range map[string]string{
		"http://127.0.0.1:1/?ca_file=" + url.QueryEscape(certFile):                                   "https://",
		srv.URL + "/?ca_file=/nonexistent/ca.pem":                                                    "/nonexistent/ca.pem",
		srv.URL + "/?ca_file=" + url.QueryEscape(notPEM):                                             "no PEM certificate",
		srv.URL + "/?ca_file=" + url.QueryEscape(certFile) + "&ca_file=" + url.QueryEscape(certFile): "ca_file",
	} {
		if _, err := stores.Open(ctx, raw); !errors.Is(err, stores.ErrInvalidURL) || !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%s) = %v, want an invalid-URL error naming %q", raw, err, want)
		}
	}
}
