package remote

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/outage"
	"github.com/watermill-inbox/inbox/stores"
	"github.com/watermill-inbox/inbox/stores/driver"
	"github.com/watermill-inbox/inbox/stores/remote/internal/wire"
)

// Store is the remote [inbox.LeaseStore]. Build it with [New]. It is safe for
// concurrent use. The portable layer it embeds ([driver.Store]) validates
// input, refuses calls once closed, fills in the lease id and names the
// store, the operation and the key in errors; the protocol is its driver's.
//
// Its methods are those of the portable layer it embeds, [driver.Store],
// with the contracts of [inbox.LeaseStore] and [inbox.Admin]:
//
//   - TryBegin(ctx, key, opts) (inbox.Claim, error): claims key with a
//     lease: Acquired, Busy (another live lease, or a failed attempt's
//     backoff), Processed or Dead.
//   - Complete(ctx, key, leaseID): marks key processed under the lease;
//     repeating it after success succeeds.
//   - Release(ctx, key, leaseID): gives the lease back unmarked.
//   - Fail(ctx, key, leaseID, opts): ends a failed attempt: the key waits
//     out opts.RetryAfter, or is dead with opts.Dead.
//   - Extend(ctx, key, leaseID, lease) (time.Time, error): renews the lease.
//   - Get(ctx, key) (inbox.Record, error): what the store knows of key.
//   - IsProcessed(ctx, key), MarkProcessed(ctx, key): the minimal contract
//     ([inbox.Store]).
//   - List, Forget, ForceRelease: the operators' calls (cmd/inboxctl).
//   - KeepsOrder, Order, ReleaseOrder ([inbox.OrderAdmin]): the store
//     keeps no order; an OrderKey fails with [inbox.ErrNotSupported].
//   - Retention() time.Duration: the retention the service announces, once
//     its discovery document is read (its own method, [Store.Retention]).
//   - BatchStats: how calls were batched; Close.
//
// Complete, Release, Fail and Extend fail with [inbox.ErrLeaseLost] when
// leaseID no longer holds the key; bad input wraps
// [inbox.ErrInvalidArgument]; a backend failure wraps
// [inbox.ErrStoreUnavailable].
type Store struct {
	*driver.Store
	c *client
}

var (
	_ inbox.LeaseStore        = (*Store)(nil)
	_ inbox.Admin             = (*Store)(nil)
	_ inbox.RetentionReporter = (*Store)(nil)
)

// Retention implements [inbox.RetentionReporter]: the retention the
// service announces in its discovery document (whole seconds), once the
// store has read it (on its first call, or [Store.Check]); zero before, and
// from a service that does not announce it.
func (s *Store) Retention() time.Duration {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if s.c.disc == nil {
		return 0
	}
	return s.c.disc.Retention
}

// client is the store's [driver.Driver]: protocol v1 over HTTP.
type client struct {
	opts   Options
	base   *url.URL
	hc     *http.Client
	auth   string // "Bearer <token>" or ""
	log    watermill.LoggerAdapter
	closed atomic.Bool

	// tokenFrom names where the token came from, for errors ("Options.Token",
	// `token_file "/run/secrets/inbox"`); tokenHint says how to give one when
	// none is configured. Neither ever holds the token.
	tokenFrom, tokenHint string

	mu         sync.Mutex
	disc       *Discovery    // nil until read
	discAbsent time.Time     // when the server last answered 404 to discovery
	discErr    error         // the last discovery failure, reused until discErrAt+discRetry
	discErrAt  time.Time     // when discErr was recorded
	discFlight chan struct{} // closed when the discovery read in flight ends; nil when none is
	discRetry  time.Duration // DiscoveryRetry; tests shorten it
}

// Discovery is what the service's discovery document (GET /v1/inbox) says.
type Discovery struct {
	// Version is the protocol version, "v1".
	Version string
	// Auth is "none" or "bearer".
	Auth string
	// LeaseMin, LeaseMax and LeaseDefault are the leases the service
	// grants, each at most [MaxLease].
	LeaseMin, LeaseMax, LeaseDefault time.Duration
	// LeasePolicy is "clamp" or "reject": what happens to a lease outside
	// [LeaseMin, LeaseMax].
	LeasePolicy string
	// Extensions lists the protocol extensions the service implements
	// ("extend", "leaseId", "payloadHash", "payloadMismatch", "fail",
	// "admin").
	Extensions []string
	// MaxRetryAfter is the longest backoff of a failed attempt the service
	// grants (its maxRetryAfterMs), at most [MaxRetryAfter]; zero when it
	// does not say.
	MaxRetryAfter time.Duration
	// Retention is the service's store's retention, in whole seconds
	// (retentionSeconds, an extension), or zero when the service does not
	// announce it.
	Retention time.Duration
}

// Bounds of what a service may answer, beyond which an answer is refused
// as broken (ErrProtocol): durations that time.Duration holds.
const (
	maxLeaseSeconds = math.MaxInt64 / int64(time.Second)
	maxMillis       = math.MaxInt64 / int64(time.Millisecond)
)

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
// by the first call. Call [Store.Check] to find a wrong URL or token before
// the first message does ([github.com/watermill-inbox/inbox/stores.Open]
// does, unless the URL says check=false).
func New(opts Options) (*Store, error) {
	return newStore(opts, "Options.Token", "set Options.Token to a token the service accepts")
}

// newStore is New with the token's source and the hint of how to give one,
// for errors.
func newStore(opts Options, tokenFrom, tokenHint string) (*Store, error) {
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	base, _ := parseBase(opts.URL)
	var hc http.Client
	if opts.HTTPClient != nil {
		hc = *opts.HTTPClient
	} else {
		hc.Transport = defaultTransport()
	}
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c := &client{opts: opts, base: base, hc: &hc, log: opts.Logger, tokenHint: tokenHint, discRetry: DiscoveryRetry}
	if opts.Token != "" {
		c.auth = "Bearer " + opts.Token
		c.tokenFrom = tokenFrom
	}
	// No Timeout of the layer's own: Options.Timeout bounds each HTTP
	// attempt, the caller's context the whole call. No batching: protocol
	// v1 has no batch endpoint. A zero Lease reaches the driver as a zero
	// Op.Lease: the request then names no lease, and the service grants
	// its default.
	ds, err := driver.New(c, driver.Config{Name: "remote store", Lease: opts.Lease})
	if err != nil {
		return nil, err
	}
	return &Store{Store: ds, c: c}, nil
}

// defaultTransport is the transport of a client without
// Options.HTTPClient: net/http's default, with more idle connections.
func defaultTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 256
	tr.MaxIdleConnsPerHost = 64
	return tr
}

// Close implements [driver.Driver]; the layer calls it once, from
// [Store.Close]. It closes idle connections; later calls, Discover and
// Check included, fail with [inbox.ErrClosed].
func (c *client) Close() error {
	c.closed.Store(true)
	c.hc.CloseIdleConnections()
	return nil
}

// endpoint is one protocol call, for errors and retries.
type endpoint struct {
	method string
	path   string // escaped, relative to the base
	query  string // raw query, "" for none
	name   string // for errors: "POST /v1/inbox/try-begin"
	retry  bool   // safe to repeat

	// maxBody bounds the answer's body; zero means
	// Options.MaxResponseBytes.
	maxBody int64
}

// result is one answered attempt.
type result struct {
	code   int
	body   []byte
	header http.Header
}

// opError builds the error of a failed call, naming the endpoint; sentinels
// are wrapped. The layer (or Discover) puts "remote store: " and the
// operation in front.
func opError(ep endpoint, format string, args ...any) error {
	return fmt.Errorf("%s: "+format, append([]any{ep.name}, args...)...)
}

// do runs ep with body (nil for GET), retrying when ep.retry and the failure
// is transient. uncertain is true when an earlier attempt may have reached
// the server without its answer coming back.
func (c *client) do(ctx context.Context, ep endpoint, body []byte) (res result, uncertain bool, err error) {
	if c.closed.Load() {
		return result{}, false, opError(ep, "%w", inbox.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return result{}, false, opError(ep, "%w", err)
	}
	attempts := 1 + c.opts.Retries
	var lastErr error
	i := 0
	for ; i < attempts; i++ {
		if i > 0 {
			wait := backoff(i, res.header)
			c.log.Debug("Remote inbox call failed; retrying", watermill.LogFields{
				"endpoint": ep.name, "attempt": i + 1, "wait": wait.String(), "error": lastErr.Error()})
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return result{}, uncertain, c.ctxError(ctx, ep, i, lastErr)
			case <-t.C:
			}
		}
		var sent bool
		res, sent, lastErr = c.attempt(ctx, ep, body)
		if lastErr == nil && !transientCode(res.code) {
			return res, uncertain, nil
		}
		if ctx.Err() != nil {
			return result{}, uncertain || sent, c.ctxError(ctx, ep, i+1, lastErr)
		}
		if errors.Is(lastErr, ErrProtocol) || tlsMistake(lastErr) {
			return result{}, uncertain || sent, lastErr // a broken answer, or a TLS mistake, comes back as it is
		}
		switch {
		case lastErr == nil && res.code == http.StatusTooManyRequests:
			// A refusal: nothing was done, so any call may be repeated,
			// but not before Retry-After, and not when that is beyond
			// what the client waits.
			lastErr = c.statusError(ep, res)
			if wait, ok := retryAfter(res.header); ok && wait > maxRetryAfterWait {
				return result{}, uncertain, lastErr
			}
			continue
		case lastErr == nil:
			lastErr = c.statusError(ep, res)
			uncertain = true // a 5xx may come after the server acted
		case sent:
			uncertain = true
		}
		if !ep.retry {
			i++
			break
		}
	}
	if i > 1 {
		return result{}, uncertain, fmt.Errorf("%w (gave up after %d attempts)", lastErr, i)
	}
	return result{}, uncertain, lastErr
}

// ctxError is the error of a call whose context ended while it was trying.
func (c *client) ctxError(ctx context.Context, ep endpoint, attempts int, last error) error {
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

// retryBackoff spaces the retries of a call (outage.Backoff's table lists
// every retry loop of the library).
var retryBackoff = outage.Backoff{Min: 50 * time.Millisecond, Max: time.Second}

// maxRetryAfterWait is the longest Retry-After (of a 429 or a 503) the
// client waits before a retry; a 429 asking longer fails at once.
const maxRetryAfterWait = 5 * time.Second

// backoff is the wait before attempt i (1-based retries): retryBackoff's,
// or a Retry-After of a 429 or 503 up to maxRetryAfterWait.
func backoff(i int, h http.Header) time.Duration {
	d := retryBackoff.Pause(i - 1)
	if ra, ok := retryAfter(h); ok {
		d = max(d, min(ra, maxRetryAfterWait))
	}
	return d
}

// retryAfter is the Retry-After header of h in whole seconds, if it has
// one.
func retryAfter(h http.Header) (time.Duration, bool) {
	sec, err := strconv.ParseInt(h.Get("Retry-After"), 10, 64)
	if err != nil || sec <= 0 {
		return 0, false
	}
	return time.Duration(min(sec, maxLeaseSeconds)) * time.Second, true
}

// attempt sends one request. sent reports whether the request may have
// reached the server (false only when the connection could not be made).
func (c *client) attempt(ctx context.Context, ep endpoint, body []byte) (res result, sent bool, err error) {
	actx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	u := *c.base
	u.Path = ""
	u.RawPath = ""
	full, err := url.Parse(c.base.EscapedPath() + ep.path)
	if err != nil {
		return result{}, false, opError(ep, "%w: %w: building the request URL: %v", inbox.ErrStoreUnavailable, ErrProtocol, err)
	}
	u.Path, u.RawPath, u.RawQuery = full.Path, full.RawPath, ep.query
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
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats method and URL
		}
		sent = !isDialError(err)
		if actx.Err() != nil && ctx.Err() == nil {
			return result{}, sent, opError(ep, "%w: no answer within %s (Options.Timeout)", inbox.ErrStoreUnavailable, c.opts.Timeout)
		}
		if tlsMistake(err) {
			return result{}, false, opError(ep, "%w: %w", inbox.ErrStoreUnavailable, err) // for Check to tell
		}
		return result{}, sent, opError(ep, "%w: %v", inbox.ErrStoreUnavailable, err)
	}
	defer resp.Body.Close()
	limit := c.opts.MaxResponseBytes
	if ep.maxBody > 0 {
		limit = ep.maxBody
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		if actx.Err() != nil && ctx.Err() == nil {
			return result{}, true, opError(ep, "%w: answer not read within %s (Options.Timeout)", inbox.ErrStoreUnavailable, c.opts.Timeout)
		}
		return result{}, true, opError(ep, "%w: reading the answer: %v", inbox.ErrStoreUnavailable, err)
	}
	if int64(len(b)) > limit {
		return result{code: resp.StatusCode}, true, opError(ep, "%w: %w: answer (HTTP %d) is over %d bytes (Options.MaxResponseBytes)",
			inbox.ErrStoreUnavailable, ErrProtocol, resp.StatusCode, limit)
	}
	return result{code: resp.StatusCode, body: b, header: resp.Header}, true, nil
}

// tlsMistake reports whether err is a TLS handshake that failed on the
// certificate, or a server that does not speak TLS: a mistake of
// configuration, not worth a retry.
func tlsMistake(err error) bool {
	if err == nil {
		return false
	}
	var certErr *tls.CertificateVerificationError
	return errors.As(err, &certErr) || notTLS(err)
}

// notTLS reports whether err says that the server answered a TLS
// handshake in plain HTTP or something else. net/http turns the
// tls.RecordHeaderError of an HTTP answer into an error of its own text.
func notTLS(err error) bool {
	var recErr tls.RecordHeaderError
	return errors.As(err, &recErr) || strings.Contains(err.Error(), "server gave HTTP response to HTTPS client")
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// statusError is the error of a non-200 answer.
func (c *client) statusError(ep endpoint, res result) error {
	var e wire.ErrorResponse
	_ = json.Unmarshal(res.body, &e)
	detail := http.StatusText(res.code)
	if e.Error != "" {
		detail = errorCode(e.Error) + ": " + quote(e.Message, maxQuotedMessage)
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
	case code == http.StatusUnauthorized:
		return opError(ep, "%w: %w: HTTP %d %s: %s", inbox.ErrStoreUnavailable, ErrUnauthorized, code, detail, c.refused())
	case code == http.StatusForbidden:
		return opError(ep, "%w: %w: HTTP %d %s: %s", inbox.ErrStoreUnavailable, ErrUnauthorized, code, detail, c.forbidden())
	case code == http.StatusNotFound:
		return opError(ep, "%w: %w: HTTP 404 %s", inbox.ErrStoreUnavailable, ErrEndpointNotFound, detail)
	case code == http.StatusNotImplemented:
		return opError(ep, "%w: HTTP 501 %s", inbox.ErrNotSupported, detail)
	case code >= 300 && code < 400:
		return opError(ep, "%w: %w: unexpected redirect (HTTP %d to %s); redirects are not followed: is the base URL right?",
			inbox.ErrStoreUnavailable, ErrProtocol, code, quote(res.header.Get("Location"), 200))
	case code == http.StatusTooManyRequests:
		wait := "no Retry-After"
		if ra, ok := retryAfter(res.header); ok {
			wait = "Retry-After " + ra.String()
		}
		return opError(ep, "%w: %w: HTTP 429 %s (%s)", inbox.ErrStoreUnavailable, ErrTooManyRequests, detail, wait)
	case code >= 500 || code == http.StatusRequestTimeout:
		return opError(ep, "%w: HTTP %d %s", inbox.ErrStoreUnavailable, code, detail)
	}
	return opError(ep, "%w: %w: unexpected HTTP %d %s", inbox.ErrStoreUnavailable, ErrProtocol, code, detail)
}

// refused says, for an answer 401 or 403, which configuration to fix: the
// token's source, never the token.
func (c *client) refused() string {
	if c.auth == "" {
		return "configuration error: the service requires a bearer token and none is configured: " + c.tokenHint
	}
	return fmt.Sprintf("configuration error: the service refused the bearer token of %s: give it a token the service accepts", c.tokenFrom)
}

// forbidden says, for an answer 403, what the service refused: a call the
// token may not make, never the token.
func (c *client) forbidden() string {
	if c.auth == "" {
		return "configuration error: the service refuses this call without a token (a service without tokens answers only loopback clients, never web pages; its admin endpoints may be off)"
	}
	return fmt.Sprintf("configuration error: the bearer token of %s may not make this call (an admin endpoint with a consumer's token, or a key outside the token's prefixes)", c.tokenFrom)
}

// maxQuotedMessage bounds the part of a server's error message quoted in
// errors.
const maxQuotedMessage = 300

// quote quotes text of the server's for an error: Go-quoted (no raw line
// breaks or control bytes reach logs), at most n bytes of it, cut at a rune
// boundary, with "..." after the quote when it was cut.
func quote(s string, n int) string {
	if len(s) <= n {
		return strconv.Quote(s)
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + fmt.Sprintf("... (%d bytes)", len(s))
}

// errorCode is the error code of an error answer for an error: as it is
// when it looks like one (snake_case, short), quoted otherwise.
func errorCode(code string) string {
	if len(code) <= 64 && strings.Trim(code, "abcdefghijklmnopqrstuvwxyz_") == "" {
		return code
	}
	return quote(code, 64)
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

// DiscoveryRetry is how long a failed discovery read (no connection, a
// timeout, 401, 5xx, a broken document, or a service that requires a token
// while none is configured) is remembered: calls within it fail at once with
// that error, without a request, so that a misconfigured or unreachable
// client sends at most one discovery request per DiscoveryRetry instead of
// one per call. A successful read is kept for the client's life.
const DiscoveryRetry = 5 * time.Second

// Discover returns the service's discovery document, reading it when it was
// not read yet. A service without one (404) gives a nil Discovery and a nil
// error; the client then assumes no extension, and asks again a minute
// later. A failed read is remembered for [DiscoveryRetry]: within it,
// Discover returns that error again without a request (the error says so).
// A read that ends because the caller's context did is not remembered.
// Concurrent callers share one read.
func (s *Store) Discover(ctx context.Context) (*Discovery, error) {
	d, err := s.c.discovery(ctx)
	if err != nil {
		return nil, fmt.Errorf("remote store: %w", err)
	}
	return d, nil
}

// discovery is Discover, its errors named by endpoint only.
func (c *client) discovery(ctx context.Context) (*Discovery, error) {
	for {
		c.mu.Lock()
		switch {
		case c.disc != nil:
			d := c.disc
			c.mu.Unlock()
			return d, nil
		case !c.discAbsent.IsZero() && time.Since(c.discAbsent) < discoveryRecheck:
			c.mu.Unlock()
			return nil, nil
		case c.discErr != nil && time.Since(c.discErrAt) < c.discRetry:
			err, age := c.discErr, time.Since(c.discErrAt)
			c.mu.Unlock()
			return nil, fmt.Errorf("%w [remembered from a discovery read %s ago: the service is asked again %s after a failure]",
				err, age.Round(time.Millisecond), c.discRetry)
		case c.discFlight != nil:
			wait := c.discFlight
			c.mu.Unlock()
			select {
			case <-wait:
				continue // read what it found
			case <-ctx.Done():
				return nil, opError(discoveryEP, "%w", ctx.Err())
			}
		}
		flight := make(chan struct{})
		c.discFlight = flight
		c.mu.Unlock()

		d, absent, err := c.readDiscovery(ctx)

		c.mu.Lock()
		c.discFlight = nil
		close(flight)
		switch {
		case err == nil && absent:
			c.discAbsent, c.discErr = time.Now(), nil
		case err == nil:
			c.disc, c.discErr = d, nil
		case ctx.Err() == nil:
			c.discErr, c.discErrAt = err, time.Now()
		}
		c.mu.Unlock()
		if err == nil && !absent {
			c.log.Info("Remote inbox service discovered", watermill.LogFields{
				"base_url": c.base.String(), "version": d.Version, "auth": d.Auth, "lease_policy": d.LeasePolicy,
				"lease_min": d.LeaseMin.String(), "lease_max": d.LeaseMax.String(), "extensions": d.Extensions})
		}
		return d, err
	}
}

// forgetDiscovery drops what discovery remembers, so that the next call reads
// the document again.
func (c *client) forgetDiscovery() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.disc, c.discAbsent, c.discErr, c.discErrAt = nil, time.Time{}, nil, time.Time{}
}

// readDiscovery sends GET /v1/inbox. absent reports a 404: a service without
// a discovery document.
func (c *client) readDiscovery(ctx context.Context) (d *Discovery, absent bool, err error) {
	res, _, err := c.do(ctx, discoveryEP, nil)
	if err != nil {
		return nil, false, err
	}
	switch res.code {
	case http.StatusOK:
	case http.StatusNotFound:
		return nil, true, nil
	default:
		return nil, false, c.statusError(discoveryEP, res)
	}
	var w wire.DiscoveryResponse
	if err := decode(discoveryEP, res, &w); err != nil {
		return nil, false, err
	}
	if w.Version != wire.Version {
		return nil, false, protoError(discoveryEP, "service speaks protocol version %q, this client %q", w.Version, wire.Version)
	}
	if w.Auth != wire.AuthNone && w.Auth != wire.AuthBearer {
		return nil, false, protoError(discoveryEP, "unknown auth %q", w.Auth)
	}
	if w.LeasePolicy != wire.PolicyClamp && w.LeasePolicy != wire.PolicyReject {
		return nil, false, protoError(discoveryEP, "unknown leasePolicy %q", w.LeasePolicy)
	}
	if lr := w.LeaseSeconds; lr != (wire.LeaseRange{}) && (lr.Min < 1 || lr.Default < lr.Min || lr.Max < lr.Default || lr.Max > maxLeaseSeconds) {
		return nil, false, protoError(discoveryEP, "leaseSeconds {min %d, default %d, max %d} is not a range 1 <= min <= default <= max <= %d",
			lr.Min, lr.Default, lr.Max, int64(maxLeaseSeconds))
	}
	if ms := w.MaxRetryAfterMs; ms < 0 || ms > maxMillis {
		return nil, false, protoError(discoveryEP, "maxRetryAfterMs %d is outside [0, %d]", ms, int64(maxMillis))
	}
	if sec := w.RetentionSeconds; sec < 0 || sec > maxLeaseSeconds {
		return nil, false, protoError(discoveryEP, "retentionSeconds %d is outside [0, %d]", sec, int64(maxLeaseSeconds))
	}
	if w.Auth == wire.AuthBearer && c.auth == "" {
		return nil, false, opError(discoveryEP, "%w: %w: %s", inbox.ErrStoreUnavailable, ErrUnauthorized, c.refused())
	}
	return &Discovery{
		Version: w.Version, Auth: w.Auth, LeasePolicy: w.LeasePolicy, Extensions: w.Extensions,
		LeaseMin:      min(time.Duration(w.LeaseSeconds.Min)*time.Second, MaxLease),
		LeaseMax:      min(time.Duration(w.LeaseSeconds.Max)*time.Second, MaxLease),
		LeaseDefault:  min(time.Duration(w.LeaseSeconds.Default)*time.Second, MaxLease),
		MaxRetryAfter: min(time.Duration(w.MaxRetryAfterMs)*time.Millisecond, MaxRetryAfter),
		Retention:     time.Duration(w.RetentionSeconds) * time.Second,
	}, false, nil
}

// CheckKey is the key [Store.Check] reads (GET /v1/inbox/{key}) to prove
// that the service accepts the token and that its store answers. It is only
// read, never written. A service may let every token read it, whatever
// key prefixes limit the token (the reference server does).
const CheckKey = "inbox-remote:check"

// Check tells whether the service works for this client, reading it afresh
// (it forgets a remembered discovery first):
//
//  1. It reads the discovery document: a service that requires a bearer
//     token while none is configured fails here, without sending one.
//  2. It reads CheckKey with the token: a 401 or 403 (a wrong token) fails,
//     naming the token's source (the token file's path, the URL's token=
//     parameter or Options.Token), never the token; a 404 from a service
//     without a discovery document (a wrong base URL) fails; so does a
//     service whose store does not answer.
//
// A mistake of configuration (no token, a refused token, a URL that is not
// an inbox service of protocol v1) is an error wrapping
// [stores.ErrMisconfigured], [inbox.ErrStoreUnavailable] and [ErrUnauthorized],
// [ErrEndpointNotFound] or [ErrProtocol]; a service that does not answer, or
// answers 5xx, gives an error wrapping [inbox.ErrStoreUnavailable] only,
// since it may come back. [stores.Open] calls Check unless the URL says
// check=false; [New] does not.
func (s *Store) Check(ctx context.Context) error {
	s.c.forgetDiscovery()
	err := func() error {
		if _, err := s.Discover(ctx); err != nil {
			return err
		}
		_, err := s.Get(ctx, CheckKey)
		return err
	}()
	base := s.c.base.String()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrUnauthorized):
		return stores.Misconfigured(fmt.Sprintf("remote store: the inbox service at %s refuses this client", base), err)
	case errors.Is(err, ErrEndpointNotFound):
		return stores.Misconfigured(fmt.Sprintf("remote store: %s is not an inbox service (404 for the discovery document and for a key): is the base URL right?", base), err)
	case errors.Is(err, ErrProtocol):
		return stores.Misconfigured(fmt.Sprintf("remote store: %s does not answer as an inbox service of protocol v1: is the base URL right?", base), err)
	case errors.As(err, new(*tls.CertificateVerificationError)):
		return stores.Misconfigured(fmt.Sprintf("remote store: the TLS certificate of %s is not trusted: name the CA that signed it with ca_file=<PEM file> in the store URL (Options.HTTPClient for New), or connect by a name the certificate holds", base), err)
	case notTLS(err):
		return stores.Misconfigured(fmt.Sprintf("remote store: %s does not answer in TLS: write http:// instead of https://, or point the URL at the service's TLS port", base), err)
	}
	return fmt.Errorf("remote store: checking the inbox service at %s: %w", base, err)
}
