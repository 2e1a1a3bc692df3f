package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/remote/internal/wire"
)

// Store is the remote [inbox.LeaseStore]. Build it with [New]. It is safe for
// concurrent use.
type Store struct {
	opts   Options
	base   *url.URL
	hc     *http.Client
	auth   string // "Bearer <token>" or ""
	log    watermill.LoggerAdapter
	closed atomic.Bool

	mu         sync.Mutex
	disc       *Discovery // nil until read
	discAbsent time.Time  // when the server last answered 404 to discovery
}

var _ inbox.LeaseStore = (*Store)(nil)

// Discovery is what the service's discovery document (GET /v1/inbox) says.
type Discovery struct {
	// Version is the protocol version, "v1".
	Version string
	// Auth is "none" or "bearer".
	Auth string
	// LeaseMin, LeaseMax and LeaseDefault are the leases the service grants.
	LeaseMin, LeaseMax, LeaseDefault time.Duration
	// LeasePolicy is "clamp" or "reject": what happens to a lease outside
	// [LeaseMin, LeaseMax].
	LeasePolicy string
	// Extensions lists the protocol extensions the service implements
	// ("extend", "leaseId", "payloadHash", "payloadMismatch").
	Extensions []string
}

// Has reports whether d lists extension ext.
func (d *Discovery) Has(ext string) bool {
	if d == nil {
		return false
	}
	for _, e := range d.Extensions {
		if e == ext {
			return true
		}
	}
	return false
}

// New returns a store for opts. It does no I/O: the service is first reached
// by the first call.
func New(opts Options) (*Store, error) {
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	base, _ := parseBase(opts.URL)
	var hc http.Client
	if opts.HTTPClient != nil {
		hc = *opts.HTTPClient
	} else {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConns = 256
		tr.MaxIdleConnsPerHost = 64
		hc.Transport = tr
	}
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	s := &Store{opts: opts, base: base, hc: &hc, log: opts.Logger}
	if opts.Token != "" {
		s.auth = "Bearer " + opts.Token
	}
	return s, nil
}

// Close closes idle connections; later calls fail with [inbox.ErrClosed].
func (s *Store) Close() error {
	s.closed.Store(true)
	s.hc.CloseIdleConnections()
	return nil
}

// endpoint is one protocol call, for errors and retries.
type endpoint struct {
	method string
	path   string // escaped, relative to the base
	name   string // for errors: "POST /v1/inbox/try-begin"
	retry  bool   // safe to repeat
}

// result is one answered attempt.
type result struct {
	code   int
	body   []byte
	header http.Header
}

// opError builds the error of a failed call. sentinels are wrapped.
func opError(ep endpoint, format string, args ...any) error {
	return fmt.Errorf("remote store: %s: "+format, append([]any{ep.name}, args...)...)
}

// do runs ep with body (nil for GET), retrying when ep.retry and the failure
// is transient. uncertain is true when an earlier attempt may have reached
// the server without its answer coming back.
func (s *Store) do(ctx context.Context, ep endpoint, body []byte) (res result, uncertain bool, err error) {
	if s.closed.Load() {
		return result{}, false, opError(ep, "%w", inbox.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return result{}, false, opError(ep, "%w", err)
	}
	attempts := 1
	if ep.retry {
		attempts += s.opts.Retries
	}
	var lastErr error
	for i := 0; i < attempts; i++ {
		if i > 0 {
			wait := backoff(i, res.header)
			s.log.Debug("Remote inbox call failed; retrying", watermill.LogFields{
				"endpoint": ep.name, "attempt": i + 1, "wait": wait.String(), "error": lastErr.Error()})
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return result{}, uncertain, s.ctxError(ctx, ep, i, lastErr)
			case <-t.C:
			}
		}
		var sent bool
		res, sent, lastErr = s.attempt(ctx, ep, body)
		if lastErr == nil && !transientCode(res.code) {
			return res, uncertain, nil
		}
		if ctx.Err() != nil {
			return result{}, uncertain || sent, s.ctxError(ctx, ep, i+1, lastErr)
		}
		if errors.Is(lastErr, ErrProtocol) {
			return result{}, uncertain || sent, lastErr // a broken answer comes back broken
		}
		if lastErr == nil {
			lastErr = statusError(ep, res)
			uncertain = true // a 5xx may come after the server acted
		} else if sent {
			uncertain = true
		}
	}
	if attempts > 1 {
		return result{}, uncertain, fmt.Errorf("%w (gave up after %d attempts)", lastErr, attempts)
	}
	return result{}, uncertain, lastErr
}

// ctxError is the error of a call whose context ended while it was trying.
func (s *Store) ctxError(ctx context.Context, ep endpoint, attempts int, last error) error {
	cause := ctx.Err()
	if errors.Is(cause, context.Canceled) {
		return opError(ep, "%w after %d attempt(s)", cause, attempts)
	}
	if last == nil {
		return opError(ep, "%w: %w: no answer within the caller's deadline", inbox.ErrStoreUnavailable, cause)
	}
	return opError(ep, "%w: %w after %d attempt(s); last: %v", inbox.ErrStoreUnavailable, cause, attempts, last)
}

// transientCode reports whether an HTTP status is worth a retry.
func transientCode(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusTooManyRequests ||
		(code >= 500 && code != http.StatusNotImplemented)
}

// backoff is the wait before attempt i (1-based retries): 50 ms doubling up
// to 1 s, jittered over its upper half; a Retry-After of a 429 or 503 is
// honoured up to 5 s.
func backoff(i int, h http.Header) time.Duration {
	d := 50 * time.Millisecond << (i - 1)
	if d > time.Second || d <= 0 {
		d = time.Second
	}
	d = d/2 + rand.N(d/2+1)
	if h != nil {
		if sec, err := strconv.Atoi(h.Get("Retry-After")); err == nil && sec > 0 {
			ra := min(time.Duration(sec)*time.Second, 5*time.Second)
			d = max(d, ra)
		}
	}
	return d
}

// attempt sends one request. sent reports whether the request may have
// reached the server (false only when the connection could not be made).
func (s *Store) attempt(ctx context.Context, ep endpoint, body []byte) (res result, sent bool, err error) {
	actx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	u := *s.base
	u.Path = ""
	u.RawPath = ""
	full, err := url.Parse(s.base.EscapedPath() + ep.path)
	if err != nil {
		return result{}, false, opError(ep, "%w: %w: building the request URL: %v", inbox.ErrStoreUnavailable, ErrProtocol, err)
	}
	u.Path, u.RawPath = full.Path, full.RawPath
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(actx, ep.method, u.String(), rd)
	if err != nil {
		return result{}, false, opError(ep, "%w: building the request: %v", inbox.ErrStoreUnavailable, err)
	}
	req.URL = &u // exactly as escaped: no re-parsing may alter the key
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "watermill-inbox-remote/v1")
	if s.auth != "" {
		req.Header.Set("Authorization", s.auth)
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats method and URL
		}
		sent = !isDialError(err)
		if actx.Err() != nil && ctx.Err() == nil {
			return result{}, sent, opError(ep, "%w: no answer within %s (Options.Timeout)", inbox.ErrStoreUnavailable, s.opts.Timeout)
		}
		return result{}, sent, opError(ep, "%w: %v", inbox.ErrStoreUnavailable, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, s.opts.MaxResponseBytes+1))
	if err != nil {
		if actx.Err() != nil && ctx.Err() == nil {
			return result{}, true, opError(ep, "%w: answer not read within %s (Options.Timeout)", inbox.ErrStoreUnavailable, s.opts.Timeout)
		}
		return result{}, true, opError(ep, "%w: reading the answer: %v", inbox.ErrStoreUnavailable, err)
	}
	if int64(len(b)) > s.opts.MaxResponseBytes {
		return result{code: resp.StatusCode}, true, opError(ep, "%w: %w: answer (HTTP %d) is over %d bytes (Options.MaxResponseBytes)",
			inbox.ErrStoreUnavailable, ErrProtocol, resp.StatusCode, s.opts.MaxResponseBytes)
	}
	return result{code: resp.StatusCode, body: b, header: resp.Header}, true, nil
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// statusError is the error of a non-200 answer.
func statusError(ep endpoint, res result) error {
	var e wire.ErrorResponse
	_ = json.Unmarshal(res.body, &e)
	detail := http.StatusText(res.code)
	if e.Error != "" {
		detail = fmt.Sprintf("%s: %s", e.Error, truncate(e.Message, 300))
	}
	code := res.code
	switch {
	case code == http.StatusBadRequest:
		sentinel := inbox.ErrInvalidArgument
		switch e.Error {
		case wire.CodeInvalidKey:
			sentinel = inbox.ErrInvalidKey
		case wire.CodeInvalidLease:
			sentinel = inbox.ErrInvalidLease
		case wire.CodeInvalidLeaseID:
			sentinel = inbox.ErrInvalidLeaseID
		}
		return opError(ep, "%w: server refused the request (HTTP 400 %s)", sentinel, detail)
	case code == http.StatusRequestEntityTooLarge:
		return opError(ep, "%w: request body is over the server's limit (HTTP 413 %s)", inbox.ErrInvalidArgument, detail)
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return opError(ep, "%w: %w: HTTP %d %s", inbox.ErrStoreUnavailable, ErrUnauthorized, code, detail)
	case code == http.StatusNotFound:
		return opError(ep, "%w: %w: HTTP 404 %s", inbox.ErrStoreUnavailable, ErrEndpointNotFound, detail)
	case code == http.StatusNotImplemented:
		return opError(ep, "%w: HTTP 501 %s", inbox.ErrNotSupported, detail)
	case code >= 300 && code < 400:
		return opError(ep, "%w: %w: unexpected redirect (HTTP %d to %q); redirects are not followed: is the base URL right?",
			inbox.ErrStoreUnavailable, ErrProtocol, code, res.header.Get("Location"))
	case code >= 500 || code == http.StatusRequestTimeout || code == http.StatusTooManyRequests:
		return opError(ep, "%w: HTTP %d %s", inbox.ErrStoreUnavailable, code, detail)
	}
	return opError(ep, "%w: %w: unexpected HTTP %d %s", inbox.ErrStoreUnavailable, ErrProtocol, code, detail)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// decode reads a 200 answer into v.
func decode(ep endpoint, res result, v any) error {
	if err := json.Unmarshal(res.body, v); err != nil {
		return opError(ep, "%w: %w: malformed JSON in the 200 answer: %v", inbox.ErrStoreUnavailable, ErrProtocol, err)
	}
	return nil
}

// protoError is an answer that breaks the protocol.
func protoError(ep endpoint, format string, args ...any) error {
	return opError(ep, "%w: %w: "+format, append([]any{inbox.ErrStoreUnavailable, ErrProtocol}, args...)...)
}

var discoveryEP = endpoint{method: http.MethodGet, path: wire.Discovery, name: "GET " + wire.Discovery, retry: true}

// discoveryRecheck is how long a 404 on discovery is believed before it is
// asked again.
const discoveryRecheck = time.Minute

// Discover returns the service's discovery document, reading it when it was
// not read yet. A service without one (404) gives a nil Discovery and a nil
// error; the client then assumes no extension.
func (s *Store) Discover(ctx context.Context) (*Discovery, error) {
	s.mu.Lock()
	d, absent := s.disc, s.discAbsent
	s.mu.Unlock()
	if d != nil || (!absent.IsZero() && time.Since(absent) < discoveryRecheck) {
		return d, nil
	}
	res, _, err := s.do(ctx, discoveryEP, nil)
	if err != nil {
		return nil, err
	}
	switch res.code {
	case http.StatusOK:
	case http.StatusNotFound:
		s.mu.Lock()
		s.discAbsent = time.Now()
		s.mu.Unlock()
		return nil, nil
	default:
		return nil, statusError(discoveryEP, res)
	}
	var w wire.DiscoveryResponse
	if err := decode(discoveryEP, res, &w); err != nil {
		return nil, err
	}
	if w.Version != wire.Version {
		return nil, protoError(discoveryEP, "service speaks protocol version %q, this client %q", w.Version, wire.Version)
	}
	if w.Auth != wire.AuthNone && w.Auth != wire.AuthBearer {
		return nil, protoError(discoveryEP, "unknown auth %q", w.Auth)
	}
	if w.LeasePolicy != wire.PolicyClamp && w.LeasePolicy != wire.PolicyReject {
		return nil, protoError(discoveryEP, "unknown leasePolicy %q", w.LeasePolicy)
	}
	if w.Auth == wire.AuthBearer && s.auth == "" {
		return nil, opError(discoveryEP, "%w: %w: the service requires a bearer token and none is configured (token_file or Options.Token)",
			inbox.ErrStoreUnavailable, ErrUnauthorized)
	}
	d = &Discovery{
		Version: w.Version, Auth: w.Auth, LeasePolicy: w.LeasePolicy, Extensions: w.Extensions,
		LeaseMin: time.Duration(w.LeaseSeconds.Min) * time.Second, LeaseMax: time.Duration(w.LeaseSeconds.Max) * time.Second,
		LeaseDefault: time.Duration(w.LeaseSeconds.Default) * time.Second,
	}
	s.mu.Lock()
	s.disc = d
	s.mu.Unlock()
	s.log.Info("Remote inbox service discovered", watermill.LogFields{
		"base_url": s.base.String(), "version": d.Version, "auth": d.Auth, "lease_policy": d.LeasePolicy,
		"lease_min": d.LeaseMin.String(), "lease_max": d.LeaseMax.String(), "extensions": d.Extensions})
	return d, nil
}
