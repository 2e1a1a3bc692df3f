package server

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/watermill-inbox/inbox"
)

// LeasePolicy says what the server does with a requested lease outside
// [Config.LeaseMin, Config.LeaseMax].
type LeasePolicy string

const (
	// PolicyClamp grants the nearest bound. The default.
	PolicyClamp LeasePolicy = "clamp"
	// PolicyReject answers 400 invalid_lease.
	PolicyReject LeasePolicy = "reject"
)

// Defaults of [Config].
const (
	DefaultLeaseMin     = 30 * time.Second
	DefaultLeaseMax     = 120 * time.Second
	DefaultLeaseDefault = inbox.DefaultLease
	DefaultMaxBodyBytes = 16 << 10
	DefaultReadyTimeout = 2 * time.Second
	DefaultStoreTimeout = 10 * time.Second
	// DefaultMaxRetryAfter bounds the backoff of a failed attempt (the fail
	// extension's retryAfterMs).
	DefaultMaxRetryAfter = 24 * time.Hour
	// DefaultAuthFailuresPerMinute bounds the failed authentications of a
	// client address.
	DefaultAuthFailuresPerMinute = 60
	// DefaultMaxRecordsPerToken bounds the live records of each consumer
	// token on a store that does not evict (StoreCapacity zero): as many
	// as the memory store keeps by default, about 100 MB of the server's
	// memory for the count when a token reaches it. At the default
	// retention of 7 days it lets a token keep up about 1.6 new keys a
	// second; size MaxRecordsPerToken for the rate and the retention.
	DefaultMaxRecordsPerToken = 1_000_000
)

// defaultMaxRecordsPerToken is DefaultMaxRecordsPerToken; a test lowers it
// to reach the bound.
var defaultMaxRecordsPerToken = DefaultMaxRecordsPerToken

// MinTokenBytes is the shortest bearer token the server accepts in its
// configuration: a shorter one could be guessed.
const MinTokenBytes = 16

// PrefixSeparator ends every key prefix of a [Grant], as it ends the
// parts of an inbox key: without it, prefix "app" would reach "apple:1",
// another namespace's key.
const PrefixSeparator = ":"

// ErrInvalidConfig is wrapped by the errors of [Config.Validate].
var ErrInvalidConfig = fmt.Errorf("%w: invalid inbox server config", inbox.ErrInvalidArgument)

// Config configures [New]. Only Store is required.
type Config struct {
	// Store is the store the server serves. Required. The server does not
	// close it. Retention is the store's own setting. The admin endpoints
	// (list, forget, force-release) are served, and the discovery document
	// lists the admin extension, when it implements inbox.Admin, as every
	// store of this project does.
	Store inbox.LeaseStore

	// Retention is the Store's retention, as configured on the store
	// itself. The server tells a client that does not read the status Dead
	// (a try-begin without acceptDead, a GET without ?acceptDead=true) when
	// a dead key's record expires: such a client is told Busy, or
	// InProgress, until then. The discovery document announces it
	// (retentionSeconds, whole seconds) when it is known: set here, or
	// reported by the Store ([inbox.RetentionReporter]); clients use it to
	// tell messages too old to be checked. Optional; default the Store's
	// own, else inbox.DefaultRetention, every store's default.
	Retention time.Duration

	// Token turns bearer authentication on: every call of a consumer (all
	// but discovery, the admin endpoints, /healthz and /readyz) must carry
	// "Authorization: Bearer <Token>", else the answer is 401; so must
	// /metrics, unless MetricsOpen. Optional; default "" (auth none). A
	// token (here, in Tokens, Grants or AdminTokens) has at least
	// [MinTokenBytes]. The token is never logged.
	//
	// Without any consumer token (Token, Tokens, Grants), auth is none, and
	// the server defends against web pages instead: it refuses (403
	// forbidden) every request but /healthz and /readyz that carries an
	// Origin header (a browser's cross-site request) or whose Host header
	// is not a loopback name or address (localhost, 127.0.0.0/8, ::1, with
	// or without port) or one of AllowedHosts (DNS rebinding), or that a
	// proxy relayed (a Forwarded, X-Forwarded-* or X-Real-IP header).
	Token string

	// Tokens are more accepted bearer tokens, beside Token: for a rotation
	// without downtime, accept the old and the new one, move the clients,
	// then drop the old one ([Server.SetTokens] changes the set while
	// serving). Any token turns auth on. Optional.
	Tokens []string

	// Grants are more consumers' tokens, beside Token and Tokens, each
	// with the key prefixes it may touch ([Server.SetGrants] changes them
	// while serving). Optional.
	Grants []Grant

	// AdminTokens are the operators' bearer tokens: the admin endpoints
	// (list, forget, force-release) need one of them, and a consumer's
	// token is answered 403 forbidden there. An admin token is also
	// accepted on every other endpoint, for every key. A token that is
	// both an admin's and a consumer's is an admin's; Validate refuses
	// that. [Server.SetAdminTokens] changes them while serving. Optional.
	// Without any, the admin endpoints are off (403
	// forbidden, and the discovery document leaves the admin extension
	// out), unless AdminNoAuth.
	AdminTokens []string

	// AdminNoAuth serves the admin endpoints without a token. It needs auth
	// none (no Token, Tokens, Grants or AdminTokens): every caller may then
	// act on every key anyway, and the Host and Origin checks stop web
	// pages. Optional; default false. cmd/inboxd sets it when it serves
	// auth none on a loopback address.
	AdminNoAuth bool

	// AllowedHosts are the host names or addresses, besides the loopback
	// ones, that a request's Host header may name when auth is none (see
	// Token): the names under which trusted clients reach a server without
	// tokens on a private network. A port in the Host header is ignored;
	// names are compared without regard to case. Optional.
	AllowedHosts []string

	// MetricsOpen serves /metrics without a token. Optional; default false:
	// when consumers need a token, /metrics needs one too (a consumer's or
	// an admin's).
	MetricsOpen bool

	// MaxRetryAfter bounds the backoff of a failed attempt (retryAfterMs of
	// the fail extension), in whole milliseconds; the discovery document
	// says it (maxRetryAfterMs). A longer one is clamped to it or refused
	// with 400 invalid_argument, as LeasePolicy says for leases. Optional;
	// default 24 h.
	MaxRetryAfter time.Duration

	// MaxRecordsPerToken bounds the live records each consumer token may
	// have in the store: a try-begin or a mark-processed without lease
	// that would make one more is answered 429 quota_exceeded, with
	// Retry-After the time until the token's oldest record expires. Tokens
	// limited to the same key prefixes (the old and the new token of a
	// rotation) count as one, and so do the tokens without prefixes; admin
	// tokens are not limited. The server counts records in its memory
	// (about a hundred bytes each), since its start, from the call that
	// may create one until the lease or backoff it started and Retention
	// have passed since its last write through the server, so that no
	// record outlives its count. Optional; default: with StoreCapacity,
	// StoreCapacity shared equally among the tokens (see there); else
	// [DefaultMaxRecordsPerToken], on every store, so that no token fills
	// a store that is shared or evicts when full (a Redis with maxmemory).
	// Negative: no bound of the server's (the store's own size is then
	// the only one).
	MaxRecordsPerToken int

	// StoreCapacity is the number of records Store keeps before it evicts
	// the least recently written: the memory store's MaxEntries
	// (cmd/inboxd sets it from a memory:// URL). When the consumers'
	// tokens are limited to two or more sets of prefixes, the server
	// refuses (429 quota_exceeded) a call that would make the records it
	// counts, the admins' included, pass StoreCapacity, and each token's
	// share is StoreCapacity divided among them unless MaxRecordsPerToken
	// says otherwise: no token's records can evict another's processed
	// keys. With one set, the store evicts as it does without the server.
	// Optional; default 0: a store that does not evict.
	StoreCapacity int

	// RequestsPerSecond bounds each consumer token's requests (tokens
	// counted as for MaxRecordsPerToken), in bursts of a second's worth:
	// beyond, the answer is 429 rate_limited with Retry-After. Admin tokens
	// are not limited. Optional; default 0: no bound.
	RequestsPerSecond float64

	// AuthFailuresPerMinute bounds the requests with a wrong bearer token
	// from one client address (an IPv4 address, an IPv6 /64): past it, the
	// address's requests that need a token are answered 429
	// too_many_auth_failures, the token unchecked, until the budget refills
	// (AuthFailuresPerMinute a minute). Behind a reverse proxy every client
	// has the proxy's address. The server keeps at most 4096 addresses;
	// past that, new ones push out those whose budget is full again, then
	// others, blocked ones last. Optional; default
	// DefaultAuthFailuresPerMinute; negative: no bound.
	AuthFailuresPerMinute int

	// LeaseMin and LeaseMax bound the leases the server grants, in whole
	// seconds. Optional; defaults 30 s and 120 s (the inbox ADR's range).
	// Tests may set LeaseMin to 1 s.
	LeaseMin, LeaseMax time.Duration

	// LeaseDefault is the lease granted when a call names none, in whole
	// seconds within [LeaseMin, LeaseMax]. Optional; default 30 s.
	LeaseDefault time.Duration

	// LeasePolicy says what happens to a requested lease outside
	// [LeaseMin, LeaseMax]. Optional; default PolicyClamp.
	LeasePolicy LeasePolicy

	// MaxBodyBytes bounds a request body: a larger one is answered 413.
	// Optional; default 16 KiB, which holds any valid request.
	MaxBodyBytes int64

	// MaxKeyBytes bounds keys, in bytes. Optional; default and upper limit
	// inbox.MaxKeyLen (1024).
	MaxKeyBytes int

	// ReadyTimeout bounds the store check of /readyz. Optional; default 2 s.
	ReadyTimeout time.Duration

	// StoreTimeout bounds each store call a request makes, so a hung store
	// answers 503 store_unavailable instead of holding requests. Optional;
	// default 10 s (clients time out sooner and retry).
	StoreTimeout time.Duration

	// Logger receives structured logs: failures at error, refused requests
	// at warn or info, every request at debug (with its key). Logs never
	// hold tokens or request bodies. Optional; default a logger that
	// discards.
	Logger *slog.Logger

	// Registerer receives the server's Prometheus metrics. Optional; default
	// a new registry holding them and the Go and process collectors.
	Registerer prometheus.Registerer

	// Gatherer is what /metrics serves. Optional; default Registerer when it
	// is a Gatherer (a *prometheus.Registry is), else required.
	Gatherer prometheus.Gatherer
}

func (c *Config) setDefaults() {
	if c.Retention == 0 {
		c.Retention = storeRetention(c.Store)
	}
	if c.Retention == 0 {
		c.Retention = inbox.DefaultRetention
	}
	if c.LeaseMin == 0 {
		c.LeaseMin = DefaultLeaseMin
	}
	if c.LeaseMax == 0 {
		c.LeaseMax = DefaultLeaseMax
	}
	if c.LeaseDefault == 0 {
		c.LeaseDefault = DefaultLeaseDefault
		if c.LeaseDefault < c.LeaseMin {
			c.LeaseDefault = c.LeaseMin
		}
		if c.LeaseDefault > c.LeaseMax {
			c.LeaseDefault = c.LeaseMax
		}
	}
	if c.LeasePolicy == "" {
		c.LeasePolicy = PolicyClamp
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxKeyBytes == 0 {
		c.MaxKeyBytes = inbox.MaxKeyLen
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = DefaultReadyTimeout
	}
	if c.MaxRecordsPerToken == 0 && c.StoreCapacity == 0 {
		c.MaxRecordsPerToken = defaultMaxRecordsPerToken
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = DefaultStoreTimeout
	}
	if c.MaxRetryAfter == 0 {
		c.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if c.AuthFailuresPerMinute == 0 {
		c.AuthFailuresPerMinute = DefaultAuthFailuresPerMinute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		c.Registerer = reg
	}
	if c.Gatherer == nil {
		if g, ok := c.Registerer.(prometheus.Gatherer); ok {
			c.Gatherer = g
		}
	}
}

// Grant is a consumer's bearer token and the keys it may touch.
type Grant struct {
	// Token is the bearer token. Required; at least [MinTokenBytes]. It is
	// never logged nor quoted in errors.
	Token string

	// Prefixes, when not empty, restrict the token to the keys that start
	// with one of them: a call on another key, GET included, is answered
	// 403 forbidden. Each ends with [PrefixSeparator]. Optional; default
	// none: every key.
	Prefixes []string
}

func (g Grant) validate() error {
	if err := checkToken(g.Token); err != nil {
		return fmt.Errorf("its token %v", err)
	}
	for i, p := range g.Prefixes {
		if p == "" || !utf8.ValidString(p) || len(p) > inbox.MaxKeyLen {
			return fmt.Errorf("its prefix %d must be 1 to %d bytes of UTF-8", i, inbox.MaxKeyLen)
		}
		if !strings.HasSuffix(p, PrefixSeparator) {
			return fmt.Errorf("its prefix %d %s does not end with %q: without the separator it reaches other namespaces' keys (prefix \"app\" reaches \"apple:1\"); use %s",
				i, quote(p, 100), PrefixSeparator, quote(p+PrefixSeparator, 101))
		}
	}
	return nil
}

// checkToken refuses a token shorter than MinTokenBytes, in words that
// follow "token" and never quote it.
func checkToken(t string) error {
	if len(t) < MinTokenBytes {
		return fmt.Errorf("is %d bytes, shorter than the %d bytes a token must have (make one with: head -c 32 /dev/urandom | base64)", len(t), MinTokenBytes)
	}
	return nil
}

// consumerTokens are Token, Tokens and Grants as grants.
func (c Config) consumerTokens() []Grant {
	var out []Grant
	if c.Token != "" {
		out = append(out, Grant{Token: c.Token})
	}
	for _, t := range c.Tokens {
		out = append(out, Grant{Token: t})
	}
	return append(out, c.Grants...)
}

// Validate reports every problem of c (after defaults), joined, each wrapping
// [ErrInvalidConfig]. It never quotes a token.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if c.Store == nil {
		bad("Store is required")
	}
	if c.Token != "" {
		if err := checkToken(c.Token); err != nil {
			bad("Token %v", err)
		}
	}
	for i, t := range c.Tokens {
		if err := checkToken(t); err != nil {
			bad("Tokens[%d] %v", i, err)
		}
	}
	consumers := map[string]bool{}
	for _, t := range c.consumerTokens() {
		consumers[t.Token] = true
	}
	for i, g := range c.Grants {
		if err := g.validate(); err != nil {
			bad("Grants[%d]: %v", i, err)
		}
	}
	for i, t := range c.AdminTokens {
		switch err := checkToken(t); {
		case err != nil:
			bad("AdminTokens[%d] %v", i, err)
		case consumers[t]:
			bad("AdminTokens[%d] is also a consumer's token: give operators tokens of their own", i)
		}
	}
	if c.AdminNoAuth && (len(consumers) > 0 || len(c.AdminTokens) > 0) {
		bad("AdminNoAuth needs auth none: it is for a server without any token (with tokens, give operators AdminTokens)")
	}
	for i, h := range c.AllowedHosts {
		if h == "" || strings.ContainsAny(h, " \t\r\n/@") {
			bad("AllowedHosts[%d] %q is not a host name or address", i, h)
		}
	}
	if c.MaxRetryAfter < time.Millisecond || c.MaxRetryAfter%time.Millisecond != 0 {
		bad("MaxRetryAfter %s must be a whole number of milliseconds, at least 1 ms (the protocol counts backoffs in milliseconds)", c.MaxRetryAfter)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"LeaseMin", c.LeaseMin}, {"LeaseMax", c.LeaseMax}, {"LeaseDefault", c.LeaseDefault}} {
		if d.v < time.Second || d.v%time.Second != 0 {
			bad("%s %s must be a whole number of seconds, at least 1 s (the protocol counts leases in seconds)", d.name, d.v)
		}
	}
	if c.LeaseMin > c.LeaseMax {
		bad("LeaseMin %s is above LeaseMax %s", c.LeaseMin, c.LeaseMax)
	}
	if c.LeaseDefault < c.LeaseMin || c.LeaseDefault > c.LeaseMax {
		bad("LeaseDefault %s is outside [LeaseMin %s, LeaseMax %s]", c.LeaseDefault, c.LeaseMin, c.LeaseMax)
	}
	if c.LeasePolicy != PolicyClamp && c.LeasePolicy != PolicyReject {
		bad("LeasePolicy %q is neither %q nor %q", c.LeasePolicy, PolicyClamp, PolicyReject)
	}
	if c.MaxBodyBytes < 1024 {
		bad("MaxBodyBytes %d is below 1024", c.MaxBodyBytes)
	}
	if c.MaxKeyBytes < 1 || c.MaxKeyBytes > inbox.MaxKeyLen {
		bad("MaxKeyBytes %d is outside [1, %d]", c.MaxKeyBytes, inbox.MaxKeyLen)
	}
	if c.Retention < 0 {
		bad("Retention %s is negative", c.Retention)
	}
	if c.StoreCapacity < 0 {
		bad("StoreCapacity %d may not be negative", c.StoreCapacity)
	}
	if c.RequestsPerSecond < 0 || math.IsNaN(c.RequestsPerSecond) || math.IsInf(c.RequestsPerSecond, 0) {
		bad("RequestsPerSecond %v is not a number >= 0", c.RequestsPerSecond)
	}
	if c.ReadyTimeout < 0 {
		bad("ReadyTimeout %s is negative", c.ReadyTimeout)
	}
	if c.StoreTimeout < 0 {
		bad("StoreTimeout %s is negative", c.StoreTimeout)
	}
	if c.Gatherer == nil {
		bad("Gatherer is required when Registerer is not a prometheus.Gatherer")
	}
	return errors.Join(errs...)
}

// storeRetention is the retention s reports, zero when it does not.
func storeRetention(s inbox.LeaseStore) time.Duration {
	if r, ok := s.(inbox.RetentionReporter); ok {
		return max(r.Retention(), 0)
	}
	return 0
}
