// Package server serves the remote inbox protocol v1 over any
// [inbox.LeaseStore]: it is the reference implementation of the protocol, the
// one cmd/inboxd runs, and what package
// [github.com/watermill-inbox/inbox/stores/remote] speaks to.
//
//	h, err := server.New(server.Config{Store: store, Token: token, Logger: logger})
//	if err != nil { ... }
//	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: h, ReadHeaderTimeout: 5 * time.Second}
//
// The protocol (stores/remote/openapi.yaml is its exact form):
//
//	POST /v1/inbox/try-begin       {"key", "owner"?, "leaseSeconds"?, "leaseId"?, "payloadHash"?, "acceptDead"?}
//	POST /v1/inbox/mark-processed  {"key", "leaseId"?}
//	POST /v1/inbox/release         {"key", "leaseId"}
//	POST /v1/inbox/extend          {"key", "leaseId", "leaseSeconds"?}
//	POST /v1/inbox/fail            {"key", "leaseId", "retryAfterMs"?, "dead"?, "reason"?}  (ext. fail)
//	POST /v1/inbox/list            {"state"?, "prefix"?, "olderThanMs"?, "limit"?, "cursor"?} (ext. admin)
//	POST /v1/inbox/forget          {"key"}                                                   (ext. admin)
//	POST /v1/inbox/force-release   {"key"}                                                   (ext. admin)
//	GET  /v1/inbox/{key}           ?acceptDead=true (ext. fail)
//	GET  /v1/inbox                 discovery
//
// Business outcomes are 200 answers with a status enum; 4xx and 5xx answers
// are errors with a body {"error": code, "message": text}: 400 for bad input
// (codes invalid_json, invalid_key, invalid_lease, invalid_lease_id,
// invalid_argument), 401 for a missing or wrong bearer token, 403 forbidden
// for a call the token may not make (see "Who may call what" below), or a
// browser's request to a server without tokens, 404 for an unknown path,
// 405 for a wrong method, 413 for a body over [Config.MaxBodyBytes], 415
// unsupported_media_type for a POST that is not application/json, 429
// with Retry-After over a limit ([Config.MaxRecordsPerToken],
// RequestsPerSecond, AuthFailuresPerMinute), 501 not_supported when the
// store cannot extend leases or has no admin operations, 503
// store_unavailable when the store is down or closed, 500 for other store
// failures. Unknown request fields are
// ignored; field names match exactly.
//
// The discovery document lists the extensions extend, leaseId, payloadHash,
// payloadMismatch, fail, and admin when [Config.Store] implements
// [inbox.Admin]. With fail:
//
//   - try-begin answers attempts (the key's count of acquired leases, this
//     acquisition included) with every status, and "backoff": true with a
//     Busy of a key whose failed attempt's backoff runs (no lease is live:
//     [inbox.Claim.BackingOff]; absent on a live lease); to a request with
//     "acceptDead": true, a dead key answers {"status": "Dead", "reason",
//     "attempts"}; to one without, it answers Busy (without backoff) with
//     expiresAt the dead record's expiry and retryAfterMs the time until
//     then, so a client of the protocol before the extension never sees a
//     status it cannot read and never runs a dead key's handler. The expiry
//     is the record's last write (the Fail) plus [Config.Retention].
//   - fail ends a failed attempt under its leaseId ([inbox.LeaseStore.Fail]):
//     Released (given back, acquirable once retryAfterMs has passed; until
//     then try-begin answers Busy), Dead (with "dead": true), or LeaseLost
//     (the lease no longer holds the key: a repeat after success is
//     LeaseLost too). A negative retryAfterMs, a reason over 1024 bytes or
//     holding NUL is 400 invalid_argument.
//   - GET answers reason (the latest failure's) and retryAt (while a
//     backoff runs); the status Dead only with ?acceptDead=true, else a
//     dead record reads InProgress with leaseUntil its expiry.
//
// With admin (the operators' side, under admin tokens): list answers
// {"items": [{"key", <the fields of a GET answer>}], "next"} (state is a
// status name, Dead included; olderThanMs compares lastSeen with the
// store's clock; limit is at most 1000, default 100; next is "" when the
// listing is done, else the cursor of the next page); forget answers
// {"status": "Forgotten"} and force-release {"status": "Released"}, for a
// key in any state, known or not.
//
// Decisions of this implementation:
//
//   - Routing is done here, not by [http.ServeMux], which cleans paths and
//     redirects "..", "." and "//": the key of GET /v1/inbox/{key} is taken
//     from the escaped request path and unescaped once, so any key
//     round-trips, and no answer is ever a redirect.
//   - A GET of an unknown key answers 200 {"status": "NotFound"}.
//   - mark-processed without leaseId is the inbox ADR's unleased mark
//     ([inbox.Store.MarkProcessed]): it marks the key whatever lease is held.
//   - Leases are whole seconds within [Config.LeaseMin, Config.LeaseMax];
//     outside it they are clamped or refused ([Config.LeasePolicy]). A
//     leaseSeconds of zero, negative or not an integer is refused under
//     either policy. The lease granted is answered in leaseSeconds.
//   - A fail's retryAfterMs is bounded by [Config.MaxRetryAfter] (24 h by
//     default; the discovery document's maxRetryAfterMs): a longer one is
//     clamped to it, or refused under PolicyReject, as leases are.
//   - Timestamps are RFC 3339 in UTC with up to nanosecond fractions, as
//     precise as the store keeps them.
//   - Request bodies are strict JSON: a POST must say Content-Type
//     application/json (charset utf-8 at most), else 415; a body that is not
//     valid UTF-8, holds an escaped lone surrogate, or names a member twice
//     is 400 invalid_json (encoding/json alone would read the first two as
//     U+FFFD, making two keys one record).
//
// # Who may call what
//
//   - Consumers' tokens ([Config.Token], Tokens, Grants) may call
//     try-begin, mark-processed, release, extend, fail, GET and /metrics;
//     a [Grant] with Prefixes only on keys that start with one of them (403
//     forbidden otherwise, GET included), but for the GET of the key
//     inbox-remote:check, which every token may read: the remote client's
//     check at Open reads it.
//   - Admin tokens ([Config.AdminTokens]) may call everything, the admin
//     endpoints list, forget and force-release included, on every key. A
//     consumer's token gets 403 there. Without admin tokens, the admin
//     endpoints are off (403, and no admin extension in discovery) unless
//     [Config.AdminNoAuth] serves them to everyone on a server without
//     tokens.
//   - Discovery, /healthz and /readyz (which reads a key of the store) need
//     no token: they hold no secret, and probes and load balancers cannot
//     easily send one. /metrics needs a token when consumers do, unless
//     [Config.MetricsOpen].
//   - Without consumers' tokens (auth none), every caller may make every
//     consumer call, so the server stops what a web page could make a
//     browser send: a request with an Origin header, or with a Host header
//     that is not localhost, an address of 127.0.0.0/8 or ::1 (with or
//     without port), or one of [Config.AllowedHosts], is 403 forbidden
//     (/healthz and /readyz excepted). That defeats a cross-site form POST
//     and DNS rebinding. With tokens, a page cannot send one. So is a
//     request that a proxy relayed (Forwarded, X-Forwarded-*, X-Real-IP):
//     behind a reverse proxy, auth none would be open to its clients.
//
// Metrics (Prometheus): inbox_server_requests_total{endpoint, code, status}
// and inbox_server_request_duration_seconds{endpoint}. endpoint is
// try-begin, mark-processed, release, extend, fail, list, forget,
// force-release, get, discovery, healthz, readyz, metrics or other. status
// takes one vocabulary across endpoints: the v1 status of a 200 answer of
// the protocol (Acquired, Processed, Busy, Dead, Released, Extended,
// LeaseLost, Forgotten, NotFound, Available, InProgress); OK for a 200
// answer without one (discovery, list, /healthz, /readyz, /metrics); the
// error code of an error
// answer, as in its body (invalid_json, ..., unauthorized, forbidden,
// not_found, unsupported_media_type, store_unavailable, internal_error), /readyz's 503 included
// (store_unavailable, or draining during shutdown).
package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/remote/internal/wire"
)

// Endpoint labels of the metrics and logs.
const (
	epTryBegin  = "try-begin"
	epMark      = "mark-processed"
	epRelease   = "release"
	epExtend    = "extend"
	epFail      = "fail"
	epList      = "list"
	epForget    = "forget"
	epForce     = "force-release"
	epGet       = "get"
	epDiscovery = "discovery"
	epHealthz   = "healthz"
	epReadyz    = "readyz"
	epMetrics   = "metrics"
	epOther     = "other"
)

// statusOK is the status label of a 200 answer without a v1 status
// (discovery, list, /healthz, /readyz, /metrics).
const statusOK = "OK"

// readyKey is the key /readyz reads to check the store.
const readyKey = "inboxd:readyz"

// Server is the protocol v1 [http.Handler]. Build it with [New]. It is safe
// for concurrent use.
type Server struct {
	cfg       Config
	admin     inbox.Admin // Config.Store's, nil when it has none
	log       *slog.Logger
	auth      atomic.Pointer[authState] // the accepted tokens
	authMu    sync.Mutex                // serialises the Set methods
	hosts     map[string]bool           // Config.AllowedHosts, lower case
	adminOn   bool                      // the admin endpoints are served (admin tokens, or AdminNoAuth)
	discovery []byte                    // the discovery document, encoded once
	metrics   http.Handler
	draining  atomic.Bool

	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec

	records     *records           // the live records per tenant; nil without limits
	authFails   *authFailures      // failed authentications per address; nil: no bound
	tenants     map[string]*tenant // by tenantKey, under authMu; kept across SetGrants
	adminTenant *tenant            // the operators' tokens

	ops map[string]operation // the POSTed operations of protocol v1, by path
}

// operation is one POSTed operation of protocol v1: its endpoint label,
// whether it is an admin's, and its handler of the request body.
type operation struct {
	ep    string
	admin bool
	f     func(ctx context.Context, body []byte) reply
}

// authState is the set of accepted tokens, replaced whole by the Set
// methods.
type authState struct {
	// consumers are the consumers' tokens; nil: auth none, for good (the
	// discovery document says so).
	consumers []grantHash
	// admins are the SHA-256 of the admin tokens; nil: none, for good.
	admins [][32]byte
}

// grantHash is a Grant with its token hashed.
type grantHash struct {
	hash     [32]byte
	prefixes []string
	tenant   *tenant
}

// principal is what a request's bearer token allows.
type principal struct {
	admin    bool
	prefixes []string // nil: every key
	tenant   *tenant  // what its limits count; nil: none (auth none)
}

// everyKey is the principal of a request to a server with auth none.
var everyKey = &principal{}

type principalKey struct{}

// New returns the handler for cfg. It fails with an error wrapping
// [ErrInvalidConfig] that lists every problem of cfg, or with the error of
// registering the metrics.
func New(cfg Config) (*Server, error) {
	retentionKnown := cfg.Retention > 0 || storeRetention(cfg.Store) > 0
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, records: newRecords(cfg), authFails: newAuthFailures(cfg.AuthFailuresPerMinute),
		tenants: map[string]*tenant{}, adminTenant: &tenant{admin: true}}
	s.ops = map[string]operation{
		wire.TryBegin: {epTryBegin, false, s.tryBegin}, wire.MarkProcessed: {epMark, false, s.markProcessed},
		wire.Release: {epRelease, false, s.release}, wire.Extend: {epExtend, false, s.extend}, wire.Fail: {epFail, false, s.fail},
		wire.List: {epList, true, s.list}, wire.Forget: {epForget, true, s.forget}, wire.ForceRelease: {epForce, true, s.forceRelease},
	}
	s.adminOn = len(cfg.AdminTokens) > 0 || cfg.AdminNoAuth
	extensions := wire.Extensions
	if a, ok := cfg.Store.(inbox.Admin); ok {
		s.admin = a
	}
	if s.admin == nil || !s.adminOn {
		extensions = slices.DeleteFunc(slices.Clone(extensions), func(e string) bool { return e == wire.ExtAdmin })
	}
	var st authState
	auth := wire.AuthNone
	if grants := cfg.consumerTokens(); len(grants) > 0 {
		auth = wire.AuthBearer
		st.consumers = s.hashGrants(grants)
	}
	if len(cfg.AdminTokens) > 0 {
		st.admins = hashTokens(cfg.AdminTokens)
	}
	s.auth.Store(&st)
	s.records.setTenants(countTenants(st.consumers))
	s.hosts = map[string]bool{}
	for _, h := range cfg.AllowedHosts {
		s.hosts[strings.ToLower(strings.Trim(h, "[]"))] = true
	}
	disc := wire.DiscoveryResponse{
		Version: wire.Version,
		Auth:    auth,
		LeaseSeconds: wire.LeaseRange{
			Min: int64(cfg.LeaseMin / time.Second), Max: int64(cfg.LeaseMax / time.Second),
			Default: int64(cfg.LeaseDefault / time.Second),
		},
		LeasePolicy:     string(cfg.LeasePolicy),
		Extensions:      extensions,
		MaxRetryAfterMs: int64(cfg.MaxRetryAfter / time.Millisecond),
	}
	if retentionKnown {
		disc.RetentionSeconds = int64(cfg.Retention / time.Second)
	}
	doc, err := json.Marshal(disc)
	if err != nil {
		return nil, err
	}
	s.discovery = append(doc, '\n')

	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "inbox_server_requests_total",
		Help: "Requests answered by the inbox server, by endpoint, HTTP code and v1 status or error code.",
	}, []string{"endpoint", "code", "status"})
	s.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "inbox_server_request_duration_seconds",
		Help:    "Time to answer a request, by endpoint.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	}, []string{"endpoint"})
	for _, c := range []prometheus.Collector{s.requests, s.duration} {
		if err := cfg.Registerer.Register(c); err != nil {
			return nil, fmt.Errorf("inbox server: registering metrics: %w", err)
		}
	}
	s.metrics = promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{})
	return s, nil
}

// Drain makes /readyz answer 503 from now on, so load balancers stop
// sending traffic while [http.Server.Shutdown] finishes the requests in
// flight. Every other endpoint keeps serving.
func (s *Server) Drain() { s.draining.Store(true) }

// reply is what an endpoint answers.
type reply struct {
	code       int
	body       any           // encoded as JSON
	status     string        // v1 status or error code, for metrics and logs
	key        string        // for debug logs
	err        error         // a store failure, logged
	retryAfter time.Duration // a 429's Retry-After
}

func errReply(code int, errCode, msg string) reply {
	return reply{code: code, body: wire.ErrorResponse{Error: errCode, Message: msg}, status: errCode}
}

// ServeHTTP implements [http.Handler].
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	path := r.URL.EscapedPath()
	op, isOp := s.ops[path] // a POSTed operation (a GET of its path is the key of that name)
	var ep string
	var rep reply
	switch {
	case path == "/healthz":
		ep = epHealthz
		if s.method(w, r, &rep, http.MethodGet) {
			rep = reply{code: http.StatusOK, body: map[string]string{"status": statusOK}, status: statusOK}
		}
		s.write(w, rep)
		s.done(r, ep, start, rep)
		return
	case path == "/readyz":
		ep = epReadyz
		if s.method(w, r, &rep, http.MethodGet) {
			rep = s.ready(r.Context())
		}
		s.write(w, rep)
		s.done(r, ep, start, rep)
		return
	case path == wire.Discovery:
		ep = epDiscovery
	case path == "/metrics":
		ep = epMetrics
	case r.Method == http.MethodPost && isOp:
		ep = op.ep
	case strings.HasPrefix(path, wire.KeyPrefix):
		ep = epGet
	default:
		ep = epOther
	}
	if bad := s.checkBrowser(r); bad != nil {
		s.write(w, *bad)
		s.done(r, ep, start, *bad)
		return
	}
	switch ep {
	case epDiscovery:
		if !s.method(w, r, &rep, http.MethodGet) {
			break
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(s.discovery)
		s.done(r, ep, start, reply{code: http.StatusOK, status: statusOK})
		return
	case epMetrics:
		if !s.method(w, r, &rep, http.MethodGet) {
			break
		}
		if !s.cfg.MetricsOpen {
			if _, ok := s.authorize(w, r, false, &rep); !ok {
				break
			}
		}
		s.metrics.ServeHTTP(w, r)
		s.done(r, ep, start, reply{code: http.StatusOK, status: statusOK})
		return
	case epGet:
		if !s.method(w, r, &rep, http.MethodGet) {
			break
		}
		who, ok := s.authorize(w, r, false, &rep)
		if !ok {
			break
		}
		ctx, cancel := context.WithTimeout(context.WithValue(r.Context(), principalKey{}, who), s.cfg.StoreTimeout)
		rep = s.get(ctx, path, acceptDead(r))
		cancel()
	case epOther:
		rep = errReply(http.StatusNotFound, wire.CodeNotFound, fmt.Sprintf("no endpoint %s %s in protocol v1", r.Method, quote(path, 200)))
	default:
		rep = s.post(w, r, op)
	}
	s.write(w, rep)
	s.done(r, ep, start, rep)
}

// checkBrowser refuses, on a server with auth none, what a web page can
// send: a request with an Origin header (a browser's cross-site request,
// such as a form's POST), or one whose Host header is not a loopback name
// or address or one of Config.AllowedHosts (a page whose name was rebound
// to a loopback address); and a request that a proxy relayed (Forwarded,
// X-Forwarded-*, X-Real-IP): behind a reverse proxy, auth none is open to
// the proxy's clients. With bearer auth, a page cannot send the token.
func (s *Server) checkBrowser(r *http.Request) *reply {
	if s.auth.Load().consumers != nil {
		return nil
	}
	if _, ok := r.Header["Origin"]; ok {
		rep := errReply(http.StatusForbidden, wire.CodeForbidden,
			"a request with an Origin header (from a web page) is refused by a server without tokens: give inboxd a token file (INBOX_TOKEN_FILE) to serve browsers' code")
		return &rep
	}
	if h := forwardedHeader(r.Header); h != "" {
		rep := errReply(http.StatusForbidden, wire.CodeForbidden, fmt.Sprintf(
			"a request relayed by a proxy (it carries %s) is refused by a server without tokens: behind a reverse proxy, a server without tokens is open to every client of the proxy. "+
				"Give the server a token file (cmd/inboxd: INBOX_TOKEN_FILE), or let clients reach it directly on loopback", h))
		return &rep
	}
	if !s.hostAllowed(r.Host) {
		rep := errReply(http.StatusForbidden, wire.CodeForbidden, fmt.Sprintf(
			"Host %s is not a loopback name or address, nor an allowed host: a server without tokens answers only requests to localhost, 127.0.0.1 or ::1 (cmd/inboxd: INBOX_ALLOWED_HOSTS names others)",
			quote(r.Host, 100)))
		return &rep
	}
	return nil
}

// forwardedHeader is the name of a header of h that a proxy adds to the
// requests it relays (Forwarded, X-Forwarded-*, X-Real-IP), "" when
// there is none.
func forwardedHeader(h http.Header) string {
	for name := range h { // canonical names: X-Forwarded-For, X-Real-Ip
		if name == "Forwarded" || name == "X-Real-Ip" || strings.HasPrefix(name, "X-Forwarded-") {
			return name
		}
	}
	return ""
}

// hostAllowed reports whether a Host header names a loopback name or
// address (localhost, 127.0.0.0/8, ::1) or an allowed host, with or
// without port.
func (s *Server) hostAllowed(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.ToLower(strings.Trim(host, "[]"))
	if host == "" {
		return false
	}
	if host == "localhost" || s.hosts[host] {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// quote quotes s for a message, at most n bytes of it.
func quote(s string, n int) string {
	if len(s) <= n {
		return strconv.Quote(s)
	}
	return strconv.Quote(strings.ToValidUTF8(s[:n], "")) + "..."
}

// method checks r's method, setting a 405 reply when it is not want.
func (s *Server) method(w http.ResponseWriter, r *http.Request, rep *reply, want string) bool {
	if r.Method == want || (want == http.MethodGet && r.Method == http.MethodHead) {
		return true
	}
	allow := want
	if want == http.MethodGet {
		allow = "GET, HEAD"
		if _, op := s.ops[r.URL.EscapedPath()]; op {
			allow = "GET, HEAD, POST" // POST the operation, GET the key of that name
			want = "POST"
		}
	}
	w.Header().Set("Allow", allow)
	*rep = errReply(http.StatusMethodNotAllowed, wire.CodeMethodNotAllowed, fmt.Sprintf("%s %s: use %s", r.Method, r.URL.EscapedPath(), want))
	return false
}

// authorize checks the bearer token of a request to a consumer's endpoint
// (admin false: the protocol's calls, GET, /metrics) or to an admin's,
// setting a 401 reply when it is missing or wrong and a 403 reply when it
// may not make the call. It returns what the token allows. Comparison is in
// constant time over hashes, so neither a token nor its length leaks
// through timing.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, admin bool, rep *reply) (*principal, bool) {
	st := s.auth.Load()
	if !admin && st.consumers == nil {
		return everyKey, true
	}
	if admin && !s.adminOn {
		*rep = errReply(http.StatusForbidden, wire.CodeForbidden,
			"the admin endpoints are off: this server has no admin token (cmd/inboxd: INBOX_ADMIN_TOKEN_FILE; the discovery document does not list the admin extension)")
		return nil, false
	}
	if admin && st.admins == nil { // AdminNoAuth: auth none
		return &principal{admin: true}, true
	}
	now := time.Now()
	if wait, blocked := s.authFails.blocked(r.RemoteAddr, now); blocked {
		*rep = tooMany(wire.CodeTooManyAuthFailures, fmt.Sprintf(
			"too many requests with a wrong bearer token from this address (over %d a minute): its requests are refused, whatever token they carry, for %s",
			s.cfg.AuthFailuresPerMinute, ceilSeconds(wait)), wait)
		return nil, false
	}
	h := r.Header.Get("Authorization")
	scheme, tok, _ := strings.Cut(h, " ")
	who := st.lookup(sha256.Sum256([]byte(strings.TrimSpace(tok))))
	if !strings.EqualFold(scheme, "Bearer") {
		who = nil
	}
	switch {
	case who == nil:
		w.Header().Set("WWW-Authenticate", `Bearer realm="inbox"`)
		msg := "missing bearer token"
		if h != "" {
			msg = "wrong bearer token"
			s.authFails.fail(r.RemoteAddr, now)
		}
		*rep = errReply(http.StatusUnauthorized, wire.CodeUnauthorized, msg)
		return nil, false
	case admin && !who.admin:
		*rep = errReply(http.StatusForbidden, wire.CodeForbidden, "this endpoint needs an admin token; the bearer token is a consumer's")
		return nil, false
	case who.admin:
		who.tenant = s.adminTenant
	case s.cfg.RequestsPerSecond > 0:
		if ok, wait := who.tenant.allow(s.cfg.RequestsPerSecond, now); !ok {
			*rep = tooMany(wire.CodeRateLimited, fmt.Sprintf("this bearer token is over its rate of %v requests a second", s.cfg.RequestsPerSecond), wait)
			return nil, false
		}
	}
	return who, true
}

// tooMany is a 429 answer whose Retry-After says wait, in whole seconds.
func tooMany(code, msg string, wait time.Duration) reply {
	r := errReply(http.StatusTooManyRequests, code, msg)
	r.retryAfter = wait
	return r
}

// ceilSeconds is d rounded up to whole seconds, at least 1 s: the wait a
// Retry-After says.
func ceilSeconds(d time.Duration) time.Duration {
	return max((d+time.Second-1)/time.Second, 1) * time.Second
}

// admit counts key as a record of the request's token before a call that
// may create it, or refuses the call (429 quota_exceeded) when the token's
// share of the store, or the store, is full. done takes the call's outcome.
func (s *Server) admit(ctx context.Context, key string) (done func(ok bool), bad *reply) {
	who, _ := ctx.Value(principalKey{}).(*principal)
	if who == nil {
		return func(bool) {}, nil
	}
	done, wait, reason := s.records.admit(who.tenant, key)
	if reason != "" {
		r := tooMany(wire.CodeQuotaExceeded, reason+fmt.Sprintf(": a new key is refused until a record of it expires, in %s", ceilSeconds(wait)), wait)
		r.key = key
		return nil, &r
	}
	return done, nil
}

// lookup returns what the token of hash got allows, nil when it is not
// accepted. It compares with every token, in constant time each; an admin's
// token wins over a consumer's.
func (st *authState) lookup(got [32]byte) *principal {
	var who *principal
	for i := range st.consumers {
		if subtle.ConstantTimeCompare(got[:], st.consumers[i].hash[:]) == 1 {
			who = &principal{prefixes: st.consumers[i].prefixes, tenant: st.consumers[i].tenant}
		}
	}
	for _, want := range st.admins {
		if subtle.ConstantTimeCompare(got[:], want[:]) == 1 {
			who = &principal{admin: true}
		}
	}
	return who
}

// SetTokens replaces the consumers' bearer tokens (Config.Token, Tokens and
// Grants) with tokens that may touch every key, while serving: requests
// that start after it returns are checked against them only. It fails,
// changing nothing, with an error wrapping [ErrInvalidConfig] when tokens is
// empty or holds an empty token or an admin's token, or when the server was
// made without a consumer token (its discovery document says auth none; make
// a new server to turn auth on). It never quotes a token.
func (s *Server) SetTokens(tokens ...string) error {
	grants := make([]Grant, len(tokens))
	for i, t := range tokens {
		grants[i] = Grant{Token: t}
	}
	return s.SetGrants(grants...)
}

// SetGrants is [Server.SetTokens] with each token's key prefixes.
func (s *Server) SetGrants(grants ...Grant) error {
	s.authMu.Lock()
	defer s.authMu.Unlock()
	old := s.auth.Load()
	if old.consumers == nil {
		return fmt.Errorf("%w: SetTokens on a server made without a token (auth none)", ErrInvalidConfig)
	}
	if len(grants) == 0 {
		return fmt.Errorf("%w: SetTokens with no token would refuse every client", ErrInvalidConfig)
	}
	hashes := s.hashGrants(grants)
	for i, g := range grants {
		if err := g.validate(); err != nil {
			return fmt.Errorf("%w: SetTokens: grant %d: %v", ErrInvalidConfig, i, err)
		}
		if slices.Contains(old.admins, hashes[i].hash) {
			return fmt.Errorf("%w: SetTokens: token %d is an admin's: give operators tokens of their own", ErrInvalidConfig, i)
		}
	}
	s.auth.Store(&authState{consumers: hashes, admins: old.admins})
	s.records.setTenants(countTenants(hashes))
	return nil
}

// SetAdminTokens replaces the admin tokens (Config.AdminTokens) while
// serving, as [Server.SetTokens] does the consumers'. It fails, changing
// nothing, with an error wrapping [ErrInvalidConfig] when tokens is empty or
// holds an empty token or a consumer's, or when the server was made without
// an admin token. It never quotes a token.
func (s *Server) SetAdminTokens(tokens ...string) error {
	s.authMu.Lock()
	defer s.authMu.Unlock()
	old := s.auth.Load()
	if old.admins == nil {
		return fmt.Errorf("%w: SetAdminTokens on a server made without an admin token", ErrInvalidConfig)
	}
	if len(tokens) == 0 {
		return fmt.Errorf("%w: SetAdminTokens with no token would refuse every operator", ErrInvalidConfig)
	}
	hashes := hashTokens(tokens)
	for i, t := range tokens {
		if err := checkToken(t); err != nil {
			return fmt.Errorf("%w: SetAdminTokens: token %d %v", ErrInvalidConfig, i, err)
		}
		for _, c := range old.consumers {
			if c.hash == hashes[i] {
				return fmt.Errorf("%w: SetAdminTokens: token %d is a consumer's: give operators tokens of their own", ErrInvalidConfig, i)
			}
		}
	}
	s.auth.Store(&authState{consumers: old.consumers, admins: hashes})
	return nil
}

func hashTokens(tokens []string) [][32]byte {
	hashes := make([][32]byte, len(tokens))
	for i, t := range tokens {
		hashes[i] = sha256.Sum256([]byte(t))
	}
	return hashes
}

// hashGrants hashes the grants' tokens and gives each its tenant: the
// same one as before for the same prefixes. The caller holds authMu, or
// is New.
func (s *Server) hashGrants(grants []Grant) []grantHash {
	out := make([]grantHash, len(grants))
	for i, g := range grants {
		k := tenantKey(g.Prefixes)
		t := s.tenants[k]
		if t == nil {
			t = &tenant{}
			s.tenants[k] = t
		}
		out[i] = grantHash{hash: sha256.Sum256([]byte(g.Token)), prefixes: slices.Clone(g.Prefixes), tenant: t}
	}
	return out
}

// countTenants is the number of tenants among grants.
func countTenants(grants []grantHash) int {
	seen := map[*tenant]bool{}
	for _, g := range grants {
		seen[g.tenant] = true
	}
	return len(seen)
}

// post checks the token and the Content-Type of a POSTed operation, reads
// its body and calls op's handler with it.
func (s *Server) post(w http.ResponseWriter, r *http.Request, op operation) reply {
	var rep reply
	who, ok := s.authorize(w, r, op.admin, &rep)
	if !ok {
		return rep
	}
	if bad := jsonContent(r); bad != nil {
		return *bad
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return errReply(http.StatusRequestEntityTooLarge, wire.CodeBodyTooLarge,
				fmt.Sprintf("request body is over the limit of %d bytes", s.cfg.MaxBodyBytes))
		}
		return errReply(http.StatusBadRequest, wire.CodeInvalidJSON, "cannot read the request body: "+err.Error())
	}
	ctx, cancel := context.WithTimeout(context.WithValue(r.Context(), principalKey{}, who), s.cfg.StoreTimeout)
	defer cancel()
	return op.f(ctx, body)
}

// jsonContent refuses, 415, a POST whose Content-Type is not
// application/json (with, at most, charset=utf-8): a web page's form or
// text/plain POST never reaches an operation.
func jsonContent(r *http.Request) *reply {
	ct := r.Header.Get("Content-Type")
	mt, params, err := mime.ParseMediaType(ct)
	ok := err == nil && mt == "application/json"
	for k, v := range params {
		ok = ok && k == "charset" && strings.EqualFold(v, "utf-8")
	}
	if ok {
		return nil
	}
	rep := errReply(http.StatusUnsupportedMediaType, wire.CodeUnsupportedMedia,
		fmt.Sprintf("Content-Type %s: the protocol's requests are application/json", quote(ct, 100)))
	return &rep
}

func decodeReply(err error) reply {
	var de *wire.DecodeError
	if errors.As(err, &de) {
		return errReply(http.StatusBadRequest, de.Code, de.Message)
	}
	return errReply(http.StatusBadRequest, wire.CodeInvalidJSON, err.Error())
}

// checkKey checks a key of a request: its length and form, and that the
// request's token may touch it (a 403 when it is outside the token's
// prefixes).
func (s *Server) checkKey(ctx context.Context, key string) *reply {
	if len(key) > s.cfg.MaxKeyBytes {
		r := errReply(http.StatusBadRequest, wire.CodeInvalidKey,
			fmt.Sprintf("key is %d bytes, longer than the server's limit of %d", len(key), s.cfg.MaxKeyBytes))
		return &r
	}
	if err := inbox.ValidateKey(key); err != nil {
		r := s.storeReply(err)
		return &r
	}
	if who, _ := ctx.Value(principalKey{}).(*principal); who != nil && len(who.prefixes) > 0 {
		for _, p := range who.prefixes {
			if strings.HasPrefix(key, p) {
				return nil
			}
		}
		r := errReply(http.StatusForbidden, wire.CodeForbidden, fmt.Sprintf("key %s is outside the key prefixes this bearer token may touch", quote(key, 100)))
		return &r
	}
	return nil
}

// lease applies the lease range and policy to a requested leaseSeconds.
func (s *Server) lease(sec *int64) (time.Duration, *reply) {
	if sec == nil {
		return s.cfg.LeaseDefault, nil
	}
	lo, hi := s.cfg.LeaseMin, s.cfg.LeaseMax
	if *sec <= 0 {
		r := errReply(http.StatusBadRequest, wire.CodeInvalidLease, fmt.Sprintf("leaseSeconds %d must be a positive whole number", *sec))
		return 0, &r
	}
	d := hi + time.Second // above the range when it would overflow
	if *sec < math.MaxInt64/int64(time.Second) {
		d = time.Duration(*sec) * time.Second
	}
	if d >= lo && d <= hi {
		return d, nil
	}
	if s.cfg.LeasePolicy == PolicyReject {
		r := errReply(http.StatusBadRequest, wire.CodeInvalidLease, fmt.Sprintf("leaseSeconds %d is outside the server's range [%d, %d]",
			*sec, lo/time.Second, hi/time.Second))
		return 0, &r
	}
	if d < lo {
		return lo, nil
	}
	return hi, nil
}

// seconds is a granted lease in whole seconds, rounded down (a client that
// believes its lease shorter than it is stays safe), at least 1.
func seconds(d time.Duration) int64 {
	return max(int64(d/time.Second), 1)
}

func utc(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func (s *Server) tryBegin(ctx context.Context, body []byte) reply {
	req, err := wire.DecodeTryBegin(body)
	if err != nil {
		return decodeReply(err)
	}
	if r := s.checkKey(ctx, req.Key); r != nil {
		return *r
	}
	lease, bad := s.lease(req.LeaseSeconds)
	if bad != nil {
		return *bad
	}
	opts := inbox.BeginOptions{Owner: req.Owner, Lease: lease, LeaseID: req.LeaseID, PayloadHash: req.PayloadHash}
	if req.HasLeaseID {
		// An explicit empty leaseId is bad input, not "pick one for me".
		if err := inbox.ValidateLeaseID(req.LeaseID); err != nil {
			return s.storeReply(err)
		}
	}
	if err := opts.Validate(); err != nil {
		return s.storeReply(err)
	}
	done, full := s.admit(ctx, req.Key)
	if full != nil {
		return *full
	}
	c, err := s.cfg.Store.TryBegin(ctx, req.Key, opts)
	done(err == nil)
	if err != nil {
		return s.storeFailure(req.Key, err)
	}
	resp := wire.TryBeginResponse{Status: c.Status.String(), PayloadMismatch: c.PayloadMismatch, Attempts: c.Attempts}
	if c.Status == inbox.Dead && !req.AcceptDead {
		// A client that cannot read Dead is told Busy until the record
		// expires: it never runs the handler of a dead key.
		until, err := s.deadUntil(ctx, req.Key)
		if err != nil {
			return s.storeFailure(req.Key, err)
		}
		c.Status, c.ExpiresAt, c.RetryAfter = inbox.Busy, until, time.Until(until)
		resp.Status = wire.StatusBusy
	}
	switch c.Status {
	case inbox.Acquired:
		granted := c.Lease
		if granted <= 0 {
			granted = lease
		}
		resp.LeaseID, resp.ExpiresAt, resp.LeaseSeconds = c.LeaseID, utc(c.ExpiresAt), seconds(granted)
	case inbox.Busy:
		resp.ExpiresAt, resp.RetryAfterMs = utc(c.ExpiresAt), max(wire.CeilMillis(c.RetryAfter), 1) // never early
		resp.Backoff = c.BackingOff                                                                 // false for a dead key told as Busy
	case inbox.Processed:
	case inbox.Dead:
		resp.Reason = c.Reason
	default:
		return s.storeFailure(req.Key, fmt.Errorf("store answered TryBegin with unknown status %v", c.Status))
	}
	return reply{code: http.StatusOK, body: resp, status: resp.Status, key: req.Key}
}

// deadUntil is when the dead record of key expires, as far as the server
// knows: its last write (the Fail that made it dead) plus
// [Config.Retention]. A record that is no longer dead (forgotten or marked
// since), or that outlives the retention the server was told, gives a
// second from now: the client asks again soon.
func (s *Server) deadUntil(ctx context.Context, key string) (time.Time, error) {
	rec, err := s.cfg.Store.Get(ctx, key)
	if err != nil {
		return time.Time{}, err
	}
	return s.deadExpiry(rec), nil
}

// deadExpiry is deadUntil of a record read already.
func (s *Server) deadExpiry(rec inbox.Record) time.Time {
	until := rec.LastSeen.Add(s.cfg.Retention)
	if rec.State != inbox.StateDead || rec.LastSeen.IsZero() || !time.Now().Before(until) {
		return time.Now().Add(time.Second)
	}
	return until
}

// acceptDead reports whether a GET asks for the status Dead
// (?acceptDead=true).
func acceptDead(r *http.Request) bool {
	v, err := strconv.ParseBool(r.URL.Query().Get("acceptDead"))
	return err == nil && v
}

// leaseBody decodes and checks a mark-processed, release or extend body.
func (s *Server) leaseBody(ctx context.Context, body []byte, leaseOptional bool) (wire.LeaseRequest, *reply) {
	req, err := wire.DecodeLease(body)
	if err != nil {
		r := decodeReply(err)
		return req, &r
	}
	if r := s.checkKey(ctx, req.Key); r != nil {
		return req, r
	}
	if leaseOptional && !req.HasLeaseID {
		return req, nil
	}
	if err := inbox.ValidateLeaseID(req.LeaseID); err != nil {
		r := s.storeReply(err)
		return req, &r
	}
	return req, nil
}

func (s *Server) markProcessed(ctx context.Context, body []byte) reply {
	req, bad := s.leaseBody(ctx, body, true)
	if bad != nil {
		return *bad
	}
	var err error
	if req.LeaseID == "" {
		done, full := s.admit(ctx, req.Key)
		if full != nil {
			return *full
		}
		err = s.cfg.Store.MarkProcessed(ctx, req.Key)
		done(err == nil)
	} else {
		err = s.cfg.Store.Complete(ctx, req.Key, req.LeaseID)
	}
	return s.leaseOutcome(req.Key, err, wire.StatusProcessed, wire.StatusResponse{Status: wire.StatusProcessed})
}

func (s *Server) release(ctx context.Context, body []byte) reply {
	req, bad := s.leaseBody(ctx, body, false)
	if bad != nil {
		return *bad
	}
	err := s.cfg.Store.Release(ctx, req.Key, req.LeaseID)
	return s.leaseOutcome(req.Key, err, wire.StatusReleased, wire.StatusResponse{Status: wire.StatusReleased})
}

func (s *Server) extend(ctx context.Context, body []byte) reply {
	req, bad := s.leaseBody(ctx, body, false)
	if bad != nil {
		return *bad
	}
	lease, bad := s.lease(req.LeaseSeconds)
	if bad != nil {
		return *bad
	}
	exp, err := s.cfg.Store.Extend(ctx, req.Key, req.LeaseID, lease)
	return s.leaseOutcome(req.Key, err, wire.StatusExtended,
		wire.StatusResponse{Status: wire.StatusExtended, ExpiresAt: utc(exp), LeaseSeconds: seconds(lease)})
}

// leaseOutcome answers a holder's call: ok on success, LeaseLost when the
// store says so, an error otherwise.
func (s *Server) leaseOutcome(key string, err error, status string, ok wire.StatusResponse) reply {
	switch {
	case err == nil:
		s.records.touch(key, s.cfg.LeaseMax)
		return reply{code: http.StatusOK, body: ok, status: status, key: key}
	case errors.Is(err, inbox.ErrLeaseLost):
		return reply{code: http.StatusOK, body: wire.StatusResponse{Status: wire.StatusLeaseLost}, status: wire.StatusLeaseLost, key: key}
	}
	return s.storeFailure(key, err)
}

func (s *Server) get(ctx context.Context, path string, acceptDead bool) reply {
	key, _, err := wire.KeyFromPath(path)
	if err != nil {
		return errReply(http.StatusBadRequest, wire.CodeInvalidKey, err.Error())
	}
	if key == wire.CheckKey {
		// Every token may read the check key, whatever its prefixes: a
		// client limited to its own keys checks its token with it.
		ctx = context.WithValue(ctx, principalKey{}, everyKey)
	}
	if r := s.checkKey(ctx, key); r != nil {
		return *r
	}
	rec, err := s.cfg.Store.Get(ctx, key)
	if err != nil {
		return s.storeFailure(key, err)
	}
	resp, err := s.record(rec, acceptDead)
	if err != nil {
		return s.storeFailure(key, err)
	}
	return reply{code: http.StatusOK, body: resp, status: resp.Status, key: key}
}

// record is the answer of GET, and of list's items, for rec. A dead record
// reads InProgress until its expiry for a client that did not say it reads
// Dead.
func (s *Server) record(rec inbox.Record, acceptDead bool) (wire.RecordResponse, error) {
	if rec.State < inbox.StateNotFound || rec.State > inbox.StateDead {
		return wire.RecordResponse{}, fmt.Errorf("store answered Get with unknown state %v", rec.State)
	}
	resp := wire.RecordResponse{Status: rec.State.String(), Attempts: rec.Attempts}
	if rec.State == inbox.StateNotFound {
		resp.Attempts = 0
		return resp, nil
	}
	resp.FirstSeen, resp.LastSeen, resp.LeaseUntil = utc(rec.FirstSeen), utc(rec.LastSeen), utc(rec.LeaseUntil)
	resp.Owner, resp.PayloadHash, resp.Reason, resp.RetryAt = rec.Owner, rec.PayloadHash, rec.Reason, utc(rec.RetryAt)
	if resp.FirstSeen == nil || resp.LastSeen == nil {
		return resp, fmt.Errorf("store returned a %v record without first or last seen time", rec.State)
	}
	if rec.State == inbox.StateDead && !acceptDead {
		resp.Status, resp.LeaseUntil = wire.StatusInProgress, utc(s.deadExpiry(rec))
	}
	return resp, nil
}

func (s *Server) fail(ctx context.Context, body []byte) reply {
	req, err := wire.DecodeFail(body)
	if err != nil {
		return decodeReply(err)
	}
	if r := s.checkKey(ctx, req.Key); r != nil {
		return *r
	}
	if err := inbox.ValidateLeaseID(req.LeaseID); err != nil {
		return s.storeReply(err)
	}
	opts := inbox.FailOptions{Dead: req.Dead, Reason: req.Reason}
	if req.RetryAfterMs != nil {
		var bad *reply
		if opts.RetryAfter, bad = s.retryAfter(*req.RetryAfterMs); bad != nil {
			return *bad
		}
	}
	if err := opts.Validate(); err != nil {
		return s.storeReply(err)
	}
	ok := wire.StatusReleased
	if req.Dead {
		ok = wire.StatusDead
	}
	err = s.cfg.Store.Fail(ctx, req.Key, req.LeaseID, opts)
	if err == nil {
		s.records.touch(req.Key, opts.RetryAfter)
	}
	return s.leaseOutcome(req.Key, err, ok, wire.StatusResponse{Status: ok})
}

// retryAfter applies Config.MaxRetryAfter and the lease policy to a fail's
// retryAfterMs, as lease does to leaseSeconds: a negative one is refused, a
// longer one clamped to the bound or, under PolicyReject, refused.
func (s *Server) retryAfter(ms int64) (time.Duration, *reply) {
	limit := int64(s.cfg.MaxRetryAfter / time.Millisecond)
	switch {
	case ms < 0:
		r := errReply(http.StatusBadRequest, wire.CodeInvalidArgument, fmt.Sprintf("retryAfterMs %d is negative", ms))
		return 0, &r
	case ms <= limit:
		return time.Duration(ms) * time.Millisecond, nil
	case s.cfg.LeasePolicy == PolicyReject:
		r := errReply(http.StatusBadRequest, wire.CodeInvalidArgument, fmt.Sprintf("retryAfterMs %d is over the server's limit of %d (%s, the discovery document's maxRetryAfterMs)",
			ms, limit, s.cfg.MaxRetryAfter))
		return 0, &r
	}
	return s.cfg.MaxRetryAfter, nil
}

// millis is the duration of field, a count of milliseconds, or an error
// when it is negative or too long for a time.Duration.
func millis(field string, ms int64) (time.Duration, error) {
	if limit := math.MaxInt64 / int64(time.Millisecond); ms < 0 || ms > limit {
		return 0, fmt.Errorf("%s %d is outside [0, %d]", field, ms, limit)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// noAdmin is the answer of an admin endpoint over a store without
// inbox.Admin (the discovery document then leaves the extension out).
func noAdmin() reply {
	return errReply(http.StatusNotImplemented, wire.CodeNotSupported, "the server's store has no admin operations (the discovery document does not list the admin extension)")
}

func (s *Server) list(ctx context.Context, body []byte) reply {
	if s.admin == nil {
		return noAdmin()
	}
	req, err := wire.DecodeList(body)
	if err != nil {
		return decodeReply(err)
	}
	opts := inbox.ListOptions{Prefix: req.Prefix, Cursor: req.Cursor}
	if req.State != "" {
		st, err := inbox.ParseState(req.State)
		if err != nil || st == inbox.StateNotFound {
			return errReply(http.StatusBadRequest, wire.CodeInvalidArgument,
				fmt.Sprintf("state %q is not one of Available, InProgress, Processed, Dead (leave it out to list every state)", req.State))
		}
		opts.State = st
	}
	if req.OlderThanMs != nil {
		if opts.OlderThan, err = millis("olderThanMs", *req.OlderThanMs); err != nil {
			return errReply(http.StatusBadRequest, wire.CodeInvalidArgument, err.Error())
		}
	}
	if req.Limit != nil {
		if n := *req.Limit; n < 0 || n > inbox.MaxListLimit {
			return errReply(http.StatusBadRequest, wire.CodeInvalidArgument, fmt.Sprintf("limit %d is outside [0, %d] (0 or none: %d)", n, inbox.MaxListLimit, inbox.DefaultListLimit))
		}
		opts.Limit = int(*req.Limit)
	}
	if err := opts.Validate(); err != nil {
		return s.storeReply(err)
	}
	page, err := s.admin.List(ctx, opts)
	if err != nil {
		return s.storeFailure(req.Prefix, err)
	}
	resp := wire.ListResponse{Items: make([]wire.ListItem, len(page.Items)), Next: page.Next}
	for i, it := range page.Items {
		rec, err := s.record(it.Record, true)
		if err != nil {
			return s.storeFailure(it.Key, err)
		}
		resp.Items[i] = wire.ListItem{Key: it.Key, RecordResponse: rec}
	}
	return reply{code: http.StatusOK, body: resp, status: statusOK, key: req.Prefix}
}

// keyCall is forget and force-release: a body {"key"} and one admin call.
func (s *Server) keyCall(ctx context.Context, body []byte, call func(key string) error, status string) reply {
	if s.admin == nil {
		return noAdmin()
	}
	req, err := wire.DecodeKey(body)
	if err != nil {
		return decodeReply(err)
	}
	if r := s.checkKey(ctx, req.Key); r != nil {
		return *r
	}
	if err := call(req.Key); err != nil {
		return s.storeFailure(req.Key, err)
	}
	return reply{code: http.StatusOK, body: wire.StatusResponse{Status: status}, status: status, key: req.Key}
}

func (s *Server) forget(ctx context.Context, body []byte) reply {
	return s.keyCall(ctx, body, func(key string) error {
		err := s.admin.Forget(ctx, key)
		if err == nil {
			s.records.drop(key)
		}
		return err
	}, wire.StatusForgotten)
}

func (s *Server) forceRelease(ctx context.Context, body []byte) reply {
	return s.keyCall(ctx, body, func(key string) error {
		err := s.admin.ForceRelease(ctx, key)
		if err == nil {
			s.records.touch(key, 0)
		}
		return err
	}, wire.StatusReleased)
}

func (s *Server) ready(ctx context.Context) reply {
	if s.draining.Load() {
		return reply{code: http.StatusServiceUnavailable, body: map[string]string{"status": wire.CodeDraining}, status: wire.CodeDraining}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReadyTimeout)
	defer cancel()
	if _, err := s.cfg.Store.Get(ctx, readyKey); err != nil {
		s.log.Warn("inbox server not ready: store check failed", slog.String("error", err.Error()))
		return reply{code: http.StatusServiceUnavailable, body: map[string]string{"status": wire.CodeStoreUnavailable}, status: wire.CodeStoreUnavailable}
	}
	return reply{code: http.StatusOK, body: map[string]string{"status": statusOK}, status: statusOK}
}

// storeReply maps an input error of the inbox contract to a 400.
func (s *Server) storeReply(err error) reply {
	code := wire.CodeInvalidArgument
	switch {
	case errors.Is(err, inbox.ErrInvalidKey):
		code = wire.CodeInvalidKey
	case errors.Is(err, inbox.ErrInvalidLease):
		code = wire.CodeInvalidLease
	case errors.Is(err, inbox.ErrInvalidLeaseID):
		code = wire.CodeInvalidLeaseID
	}
	return errReply(http.StatusBadRequest, code, err.Error())
}

// storeFailure maps a store error to an answer.
func (s *Server) storeFailure(key string, err error) reply {
	switch {
	case errors.Is(err, inbox.ErrInvalidArgument):
		return s.storeReply(err)
	case errors.Is(err, inbox.ErrNotSupported):
		r := errReply(http.StatusNotImplemented, wire.CodeNotSupported, "the server's store cannot do this: "+err.Error())
		r.key = key
		return r
	case errors.Is(err, inbox.ErrStoreUnavailable), errors.Is(err, inbox.ErrClosed),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		r := errReply(http.StatusServiceUnavailable, wire.CodeStoreUnavailable, "the store is unavailable")
		r.key, r.err = key, err
		return r
	}
	r := errReply(http.StatusInternalServerError, wire.CodeInternal, "the store failed")
	r.key, r.err = key, err
	return r
}

func (s *Server) write(w http.ResponseWriter, rep reply) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	switch rep.code {
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", "1")
	case http.StatusTooManyRequests:
		w.Header().Set("Retry-After", strconv.FormatInt(int64(ceilSeconds(rep.retryAfter)/time.Second), 10))
	}
	w.WriteHeader(rep.code)
	if err := json.NewEncoder(w).Encode(rep.body); err != nil {
		s.log.Debug("inbox server: writing the answer failed", slog.String("error", err.Error()))
	}
}

// done records metrics and logs for one request.
func (s *Server) done(r *http.Request, ep string, start time.Time, rep reply) {
	el := time.Since(start)
	s.requests.WithLabelValues(ep, strconv.Itoa(rep.code), rep.status).Inc()
	s.duration.WithLabelValues(ep).Observe(el.Seconds())
	attrs := []slog.Attr{
		slog.String("endpoint", ep), slog.String("method", r.Method), slog.Int("code", rep.code),
		slog.String("status", rep.status), slog.Duration("duration", el), slog.String("remote_addr", r.RemoteAddr),
	}
	switch {
	case rep.err != nil && errors.Is(rep.err, context.Canceled) && r.Context().Err() != nil:
		s.log.LogAttrs(r.Context(), slog.LevelInfo, "inbox server: client went away before the answer", attrs...)
	case rep.err != nil && rep.code >= 500:
		s.log.LogAttrs(r.Context(), slog.LevelError, "inbox server: store call failed",
			append(attrs, slog.String("error", rep.err.Error()), slog.String("key", rep.key))...)
	case rep.code == http.StatusTooManyRequests:
		// Limits are counted in metrics; a log line each would let a
		// client past its limit flood the logs.
		if s.log.Enabled(r.Context(), slog.LevelDebug) {
			s.log.LogAttrs(r.Context(), slog.LevelDebug, "inbox server: request refused over a limit", append(attrs, slog.String("key", rep.key))...)
		}
	case rep.code == http.StatusUnauthorized:
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "inbox server: unauthorized request", attrs...)
	case rep.code == http.StatusForbidden:
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "inbox server: forbidden request",
			append(attrs, slog.String("host", quote(r.Host, 100)), slog.Bool("origin", r.Header.Get("Origin") != ""))...)
	case rep.code >= 400:
		s.log.LogAttrs(r.Context(), slog.LevelInfo, "inbox server: request refused", attrs...)
	default:
		if s.log.Enabled(r.Context(), slog.LevelDebug) {
			s.log.LogAttrs(r.Context(), slog.LevelDebug, "inbox server: request", append(attrs, slog.String("key", rep.key))...)
		}
	}
}
