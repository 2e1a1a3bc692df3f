// Package remote is an [inbox.LeaseStore] that speaks the remote inbox
// protocol v1 over HTTP to an inbox service, such as cmd/inboxd (package
// [github.com/watermill-inbox/inbox/stores/remote/server]). The protocol's
// exact form is stores/remote/openapi.yaml.
//
//	s, err := remote.New(remote.Options{URL: "http://127.0.0.1:8080", Token: token})
//
// or, with [github.com/watermill-inbox/inbox/stores]:
//
//	http://127.0.0.1:8080/?token_file=/run/secrets/inbox&timeout=2s&retries=2&lease=30s
//
// # URL form
//
// The scheme is http or https; host and path are the service's base URL (a
// path prefix is kept, for services behind a proxy). Parameters:
//
//   - token_file: a file holding the bearer token (surrounding whitespace is
//     trimmed). The recommended way.
//   - token: the bearer token itself. Works, but URLs end up in process
//     listings and configuration dumps; prefer token_file.
//   - timeout: the bound of each HTTP attempt ([Options.Timeout]).
//   - retries: extra attempts of calls safe to repeat ([Options.Retries]).
//   - lease: the lease asked for when TryBegin names none ([Options.Lease]).
//   - insecure=true: let the token travel over plain http:// to a host that
//     is not loopback ([Options.Insecure]). Without it, such a URL is
//     refused at Open, before anything is sent (the discovery request
//     included): use https:// across a network.
//   - ca_file: a PEM file of the CAs that sign the service's certificate
//     (a private CA), for https:// only: the client trusts them instead
//     of the system's. [New] takes an Options.HTTPClient instead.
//   - retention is refused: retention is the service's business (set it on
//     the store URL of inboxd). The service announces it in its discovery
//     document (retentionSeconds), and [Store.Retention] reports it once the
//     document is read, for the middleware's stale check.
//   - check=false (read by [stores.Open] for every store) opens without the
//     check below.
//
// Unknown parameters are refused by name. The token never appears in logs or
// error messages ([stores.Redact] masks token parameters).
//
// # Checks at Open
//
// [stores.Open] returns a store that works for this client, or an error
// saying what to fix: it runs [Store.Check], which reads the discovery
// document and then, with the token, the key [CheckKey]. So a service that
// requires a token while the URL gives none, a token the service refuses
// (401 or 403), a base URL that is not an inbox service (404 on discovery and
// on the key) and a service whose own store is down fail at Open instead of
// failing every message. Mistakes of configuration wrap
// [stores.ErrMisconfigured]; an unreachable service wraps
// [inbox.ErrStoreUnavailable] only. Errors name the token's source (the
// token file's path, the URL's token= parameter), never the token:
//
//	remote store: the inbox service at http://127.0.0.1:8080 refuses this client (remote store: Get "inbox-remote:check": GET /v1/inbox/{key}: inbox: store unavailable: remote store: unauthorized (missing or wrong bearer token): HTTP 401 unauthorized: "wrong bearer token": configuration error: the service refused the bearer token of token_file "/run/secrets/inbox": give it a token the service accepts)
//
// With check=false, Open sends nothing: the same mistakes fail the first
// calls instead. [New] does no I/O either; call [Store.Check] after it to
// check the same things.
//
// # Behaviour
//
//   - Every call has a bound per HTTP attempt ([Options.Timeout]); the
//     caller's context bounds the whole call, retries included.
//   - Calls safe to repeat are retried, with jittered exponential backoff
//     (50 ms doubling up to 1 s, or a 503's Retry-After up to 5 s), after a
//     network error, a timeout, 408, or a 5xx other than 501; never after
//     another 4xx but 429 (below). Safe are: GET;
//     try-begin, because the client always sends its own leaseId (the
//     caller's [inbox.BeginOptions.LeaseID] or a new one), which a server
//     listing the leaseId extension honours, so a repeat by the holder gets
//     Acquired again; mark-processed, release and fail, which carry their
//     leaseId (a repeat after success changes nothing: mark-processed
//     answers Processed again, release and fail LeaseLost);
//     extend, which only moves the holder's deadline again; list, which only
//     reads. Against a server that does not list leaseId, try-begin gets one
//     attempt. forget and force-release get one attempt: a repeat after a
//     lost answer could delete, or end the lease of, a record that a
//     consumer made in between.
//   - A 429 (a limit of the service: its request rate or live records for
//     the token, failed authentications from this address) is a refusal:
//     nothing was done, so every call is retried after it, up to
//     Options.Retries times, once its Retry-After has passed (at least
//     the backoff above). A Retry-After over 5 s fails the call at once.
//     The error wraps [ErrTooManyRequests] and [inbox.ErrStoreUnavailable]:
//     the middleware nacks, and backs off as for a store that is down.
//   - A release whose first attempt went out but whose answer was lost, and
//     whose retry then hears LeaseLost, returns nil: the lease is gone either
//     way (released by the lost attempt, or lost before), which is what the
//     caller asked for. A first attempt that hears LeaseLost returns
//     [inbox.ErrLeaseLost] as usual. The same holds for a fail with a
//     backoff. A fail with Dead in that case reads the key: nil when it is
//     dead, else [inbox.ErrLeaseLost], so a caller is never told that a key
//     is dead when it is not (the middleware then returns the handler's
//     error, and the next delivery finds the key as it is).
//   - Answers are read up to [Options.MaxResponseBytes]; status enums are
//     strict: an unknown status, a status the endpoint cannot answer, a
//     missing required field or malformed JSON is an error that names it and
//     wraps [ErrProtocol] and [inbox.ErrStoreUnavailable]. So is a value out
//     of bounds, named with the value: a granted leaseSeconds outside the
//     discovery document's range (or beyond what a time.Duration holds); a
//     discovery document whose range is not 1 <= min <= default <= max; a
//     Busy retryAfterMs that is negative or beyond what a time.Duration
//     holds; an owner, a
//     payload hash, a reason, a lease id or a key longer than
//     [inbox.MaxOwnerLen], [inbox.MaxPayloadHashLen], [inbox.MaxReasonLen],
//     [inbox.MaxLeaseIDLen] or [inbox.MaxKeyLen].
//   - The service's own text in its error answers (code and message) is
//     quoted in the client's errors, Go-quoted (no raw line break or control
//     byte) and cut at 300 bytes, so a service cannot write lines of its own
//     into the logs that quote them.
//   - The client reads the discovery document (GET /v1/inbox) once, before
//     its first call, and keeps it. A failed read (no connection, timeout,
//     401, 5xx, a broken document, or a service that requires a token while
//     none is configured) is remembered for [DiscoveryRetry] (5 s): calls
//     within it fail at once with that error, without a request, so a
//     client that cannot work sends one discovery request per 5 s, not one
//     per message. A 404 (a service without discovery) is believed for a
//     minute. Concurrent calls share one read. It uses Extend only
//     when the document lists the extend extension, else Extend fails with
//     [inbox.ErrNotSupported] (the middleware then turns heartbeats off with
//     a log line). Likewise Fail needs the fail extension (without it, Fail
//     fails with [inbox.ErrNotSupported] naming it, and the middleware
//     releases instead), and List, Forget and ForceRelease ([inbox.Admin])
//     need the admin extension. A 404 on GET /v1/inbox/{key} means NotFound only from a
//     server whose discovery document was read; otherwise, as on every other
//     endpoint, a 404 is a configuration error (a wrong base URL) wrapping
//     [ErrEndpointNotFound] and [inbox.ErrStoreUnavailable], so a wrong URL
//     can never turn deduplication off. A server requiring a bearer token
//     while none is configured fails every call with [ErrUnauthorized].
//   - 401 and 403 fail with [ErrUnauthorized] and [inbox.ErrStoreUnavailable]
//     (a misconfiguration fails closed: the middleware nacks), as a
//     configuration error that names the token's source: "the service
//     refused the bearer token of token_file "/run/secrets/inbox"" (or of
//     Options.Token, or of the URL's token= parameter), or "the service
//     requires a bearer token and none is configured: add
//     token_file=<path of a file holding the token> to the store URL" (set
//     Options.Token, for a store made by [New]); a 403 says that the token
//     may not make this call (a consumer's token on an admin endpoint, a
//     key outside the token's prefixes). 400 answers
//     map to [inbox.ErrInvalidKey], [inbox.ErrInvalidLease],
//     [inbox.ErrInvalidLeaseID] or [inbox.ErrInvalidArgument] by their error
//     code; input is also checked before it is sent. Redirects are never
//     followed.
//   - Errors name the operation, the key and the endpoint ("remote store:
//     TryBegin "k": POST /v1/inbox/try-begin: ...") and wrap the sentinels
//     of package inbox; a canceled context comes back wrapping
//     [context.Canceled].
//   - Leases travel in whole seconds: a lease that is not a whole number of
//     seconds is rounded up. A TryBegin without a lease, on a client without
//     [Options.Lease], sends no leaseSeconds: the service grants its default.
//     The lease granted is the server's leaseSeconds answer (ext.); without
//     it, the lease asked for. Busy's RetryAfter is the
//     server's retryAfterMs (ext.); without it, the time left until
//     expiresAt on the local clock (clocks must then agree). Whatever the
//     service answers or announces, the client takes no wait longer than
//     [MaxRetryAfter] and no lease longer than [MaxLease]: longer ones,
//     and deadlines beyond them, are cut to them (a lease believed shorter
//     than granted is safe: the holder renews or stops sooner). Busy's
//     BackingOff (a failed attempt's backoff, not a live lease) is the
//     server's "backoff": true (ext. fail); a service that does not send it
//     (one without the fail extension, or with it from before the field
//     was added) gives false, so the middleware waits for the key
//     in-process instead of handing the message to a delay of its broker:
//     the safe fallback, as on a live lease.
//   - Times are RFC 3339 with fractions: as precise as the server's store.
//   - Keys are escaped into the path byte by byte (everything outside
//     [A-Za-z0-9_~-] as %XX, '.' and '/' included) and sent as escaped, so
//     every key round-trips.
//   - IsProcessed is GET /v1/inbox/{key}; MarkProcessed is mark-processed
//     without leaseId, the inbox ADR's unleased mark.
//   - Every try-begin says "acceptDead": true and every GET
//     ?acceptDead=true, so a service with the fail extension answers Dead
//     (with the reason) for a dead key; a service without it ignores both.
//     Claim.Attempts is the service's attempts, zero from a service that
//     does not send it. A service with the fail extension answers a client
//     that does not say acceptDead (an older one) Busy until the dead
//     record expires, so that client never runs a dead key's handler.
//   - Fail's RetryAfter and List's OlderThan travel in whole milliseconds,
//     rounded up. A list answer may hold up to [inbox.MaxListLimit] records:
//     it is read up to Options.MaxResponseBytes plus 8 KiB per record asked
//     for.
//
// # The portable layer
//
// [Store] embeds the layer of package
// [github.com/watermill-inbox/inbox/stores/driver] that every store of this
// project sits behind. It checks keys, lease ids, owners, payload hashes and
// leases before a request is made ([inbox.ErrInvalidArgument]), refuses
// calls after Close ([inbox.ErrClosed]), makes the lease id a TryBegin
// without one sends, and names the store, the operation and the key in
// errors. The layer adds no bound of its own to a call: [Options.Timeout]
// stays the bound of each HTTP attempt, and the caller's context bounds the
// whole call. What is the protocol's stays here: discovery, the 404 rule,
// retries, the token, and errors that name the endpoint.
//
// The layer does not batch this store's calls: protocol v1 has no endpoint
// that carries several calls, so each call is its own request, sent at once,
// and concurrent calls travel over concurrent connections.
//
// # Performance
//
// Each call is one HTTP round trip (plus one discovery read per client, and
// at Open the check's two requests), and
// the protocol adds the work of net/http and of the service on both sides to
// every call. That is small next to a broker round trip but not free: run
// inboxd close to its store, and use a store directly where the service's
// isolation is not needed. BenchmarkTryBeginComplete compares the memory and
// Redis stores used directly with the same stores behind the remote client
// and inboxd's handler on loopback; BENCHMARKS.md at the repository root has
// what it measured.
package remote

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
)

// Schemes this package registers with
// [github.com/watermill-inbox/inbox/stores].
const (
	Scheme    = "http"
	SchemeTLS = "https"
)

// Defaults of [Options].
const (
	DefaultTimeout          = 2 * time.Second
	DefaultRetries          = 2
	DefaultMaxResponseBytes = 64 << 10
)

// What the client believes of a service, whatever it answers or
// announces: a longer wait or lease is taken as these.
const (
	// MaxRetryAfter bounds a Busy claim's RetryAfter and ExpiresAt (from
	// retryAfterMs, or from expiresAt without it) and
	// Discovery.MaxRetryAfter.
	MaxRetryAfter = 7 * 24 * time.Hour
	// MaxLease bounds a granted lease (Claim.Lease and ExpiresAt, the
	// deadline Extend returns) and Discovery's lease range.
	MaxLease = 24 * time.Hour
)

// Errors of this package. Each error that wraps one of them also wraps
// [inbox.ErrStoreUnavailable].
var (
	// ErrUnauthorized: the service answered 401 or 403 (missing or wrong
	// bearer token), or requires a token and none is configured.
	ErrUnauthorized = errors.New("remote store: unauthorized (missing or wrong bearer token)")

	// ErrEndpointNotFound: the service answered 404 where protocol v1 has an
	// endpoint: the base URL is probably wrong.
	ErrEndpointNotFound = errors.New("remote store: endpoint not found (is the base URL right?)")

	// ErrProtocol: the answer does not follow protocol v1 (malformed JSON,
	// unknown status, missing field, unexpected HTTP status, oversize body).
	ErrProtocol = errors.New("remote store: answer violates protocol v1")

	// ErrTooManyRequests: the service answered 429: the call is over one
	// of its limits (its request rate or live records for the token,
	// failed authentications from this address), and nothing was done.
	ErrTooManyRequests = errors.New("remote store: the service refuses the call over one of its limits (429)")
)

// Options configure a [Store].
type Options struct {
	// URL is the service's base URL, http or https, with an optional path
	// prefix: "http://127.0.0.1:8080" or "https://inbox.internal/prefix".
	// Required. It must not hold a query, a fragment or user info.
	URL string

	// Token is the bearer token sent with every call. Optional; default none.
	// It is never logged nor quoted in errors. Over plain http:// it is sent
	// only to a loopback host (localhost, 127.0.0.0/8, ::1) unless Insecure:
	// anyone on the network path could read it.
	Token string

	// Insecure lets Token travel over plain http:// to a host that is not
	// loopback, for a network that is trusted (or encrypted below HTTP).
	// Optional; default false: such options are refused by Validate. It
	// does nothing else: it is refused with https://, whose certificates
	// are always checked. URL parameter: insecure=true.
	Insecure bool

	// Timeout bounds each HTTP attempt. Optional; default 2 s.
	Timeout time.Duration

	// Retries is the number of extra attempts of a call that is safe to
	// repeat. Optional; default 2; negative means none.
	Retries int

	// Lease is asked for when TryBegin names none. Optional; default 0: the
	// server's default lease.
	Lease time.Duration

	// MaxResponseBytes bounds an answer's body. Optional; default 64 KiB.
	MaxResponseBytes int64

	// HTTPClient sends the requests. Optional; default a client with its own
	// transport (64 idle connections per host). Its redirect policy is
	// replaced: redirects are never followed. Its Timeout, if any, applies
	// on top of Timeout.
	HTTPClient *http.Client

	// Logger receives the discovery at info level and retries at debug.
	// Optional; default none. Logs never hold the token.
	Logger watermill.LoggerAdapter
}

func (o *Options) setDefaults() {
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Retries == 0 {
		o.Retries = DefaultRetries
	} else if o.Retries < 0 {
		o.Retries = 0
	}
	if o.MaxResponseBytes == 0 {
		o.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if o.Logger == nil {
		o.Logger = watermill.NopLogger{}
	}
}

// ErrInvalidOptions is wrapped by the errors of [Options.Validate].
var ErrInvalidOptions = fmt.Errorf("%w: invalid remote store options", inbox.ErrInvalidArgument)

// Validate reports every problem of o (after defaults), joined, each
// wrapping [ErrInvalidOptions]. It never quotes Token.
func (o Options) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...))
	}
	if _, err := parseBase(o.URL); err != nil {
		bad("URL: %v", err)
	}
	if strings.ContainsAny(o.Token, "\r\n") {
		bad("Token holds a line break")
	}
	if u, err := parseBase(o.URL); err == nil {
		switch {
		case o.Insecure && u.Scheme == SchemeTLS:
			bad("Insecure (insecure=true) is for http:// only: it lets a token travel in clear, and never turns off the certificate checks of https://")
		case o.Token != "" && !o.Insecure && u.Scheme == Scheme && !loopbackHost(u.Hostname()):
			bad("the bearer token would cross the network in clear: %s is plain http:// to %q, which is not a loopback address; use https://, "+
				"or set Insecure (insecure=true in a store URL) if the network between them is trusted", stores.Redact(u), u.Hostname())
		}
	}
	if o.Timeout < 0 {
		bad("Timeout %s is negative", o.Timeout)
	}
	if o.Lease < 0 {
		bad("Lease %s is negative", o.Lease)
	}
	if o.MaxResponseBytes < 1024 {
		bad("MaxResponseBytes %d is below 1024", o.MaxResponseBytes)
	}
	return errors.Join(errs...)
}

// loopbackHost reports whether host (a URL's host name, without port or
// brackets) is localhost or a loopback address: 127.0.0.0/8 or ::1. A name
// that merely resolves to one is not.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// parseBase checks the base URL and returns it without a trailing slash.
func parseBase(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, errors.New("is required")
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("cannot parse it: %v", err)
	}
	switch {
	case u.Scheme != Scheme && u.Scheme != SchemeTLS:
		return nil, fmt.Errorf("scheme %q is neither http nor https", u.Scheme)
	case u.Host == "":
		return nil, fmt.Errorf("%q has no host", stores.Redact(u))
	case u.User != nil:
		return nil, fmt.Errorf("%q holds user info: give the token in Token", stores.Redact(u))
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return nil, fmt.Errorf("%q holds a query or fragment", stores.Redact(u))
	}
	b := &url.URL{Scheme: u.Scheme, Host: u.Host, Path: strings.TrimRight(u.Path, "/"), RawPath: strings.TrimRight(u.RawPath, "/")}
	return b, nil
}

// secretParams are the parameters of a remote store URL that carry secrets:
// token (token_file names a file, whose path is not secret). They are
// registered with [stores.RegisterSecretParams], so that [stores.Redact]
// masks them in logs and errors.
var secretParams = []string{"token"}

func init() {
	stores.RegisterSecretParams(secretParams...)
	stores.Register(Scheme, stores.OpenerFunc(openURL))
	stores.Register(SchemeTLS, stores.OpenerFunc(openURL))
}

// readCAs reads the PEM certificates of a ca_file parameter.
func readCAs(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is quoted below
		}
		return nil, fmt.Errorf("%w: ca_file %q: %v", stores.ErrInvalidURL, file, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%w: ca_file %q holds no PEM certificate (-----BEGIN CERTIFICATE-----)", stores.ErrInvalidURL, file)
	}
	return pool, nil
}

func openURL(ctx context.Context, u *url.URL, p stores.Params) (stores.Store, error) {
	if p.Retention != 0 {
		return nil, fmt.Errorf("%w: parameter retention is not taken by %s:// (the remote store's retention is the service's business: set it on the inbox service's own store URL)",
			stores.ErrInvalidURL, u.Scheme)
	}
	q := u.Query()
	opts := Options{Lease: p.Lease}
	tokenFrom := ""
	const tokenHint = "add token_file=<path of a file holding the token> to the store URL"
	tok, hasTok, err := stores.PopString(q, "token")
	if err != nil {
		return nil, err
	}
	file, hasFile, err := stores.PopString(q, "token_file")
	if err != nil {
		return nil, err
	}
	switch {
	case hasTok && hasFile:
		return nil, fmt.Errorf("%w: give token or token_file, not both", stores.ErrInvalidURL)
	case hasTok:
		opts.Token = tok
		tokenFrom = "the store URL's token= parameter"
	case hasFile:
		tokenFrom = fmt.Sprintf("token_file %q", file)
		b, err := os.ReadFile(file)
		if err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err // the path is quoted below; the contents never are
			}
			return nil, fmt.Errorf("%w: token_file %q: %v", stores.ErrInvalidURL, file, err)
		}
		opts.Token = strings.TrimSpace(string(b))
		if opts.Token == "" {
			return nil, fmt.Errorf("%w: token_file %q is empty", stores.ErrInvalidURL, file)
		}
	}
	if opts.Timeout, err = stores.PopDuration(q, "timeout"); err != nil {
		return nil, err
	}
	if opts.Insecure, err = stores.PopBool(q, "insecure", false); err != nil {
		return nil, err
	}
	if v, ok, err := stores.PopString(q, "retries"); err != nil {
		return nil, err
	} else if ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%w: parameter retries=%q is not a whole number >= 0", stores.ErrInvalidURL, v)
		}
		opts.Retries = n
		if n == 0 {
			opts.Retries = -1
		}
	}
	var roots *x509.CertPool
	if file, ok, err := stores.PopString(q, "ca_file"); err != nil {
		return nil, err
	} else if ok {
		if u.Scheme != SchemeTLS {
			return nil, fmt.Errorf("%w: parameter ca_file is for https:// (it names the CAs that sign the service's certificate), the URL is %s://", stores.ErrInvalidURL, u.Scheme)
		}
		if roots, err = readCAs(file); err != nil {
			return nil, err
		}
	}
	if err := stores.RejectUnknown(u.Scheme, q, "token_file", "token", "timeout", "retries", "insecure", "ca_file"); err != nil {
		return nil, err
	}
	if roots != nil {
		tr := defaultTransport()
		tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		opts.HTTPClient = &http.Client{Transport: tr}
	}
	base := *u
	base.RawQuery = ""
	base.ForceQuery = false
	opts.URL = base.String()
	s, err := newStore(opts, tokenFrom, tokenHint)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", stores.ErrInvalidURL, err)
	}
	if p.Lazy {
		return s, nil
	}
	if err := s.Check(ctx); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}
