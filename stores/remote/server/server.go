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
// invalid_argument), 401 for a missing or wrong bearer token, 404 for an
// unknown path, 405 for a wrong method, 413 for a body over
// [Config.MaxBodyBytes], 501 not_supported when the store cannot extend
// leases or has no admin operations, 503 store_unavailable when the store is
// down or closed, 500 for other store failures. Unknown request fields are
// ignored; field names match exactly.
//
// The discovery document lists the extensions extend, leaseId, payloadHash,
// payloadMismatch, fail, and admin when [Config.Store] implements
// [inbox.Admin]. With fail:
//
//   - try-begin answers attempts (the key's count of acquired leases, this
//     acquisition included) with every status; to a request with
//     "acceptDead": true, a dead key answers {"status": "Dead", "reason",
//     "attempts"}; to one without, it answers Busy with expiresAt the dead
//     record's expiry and retryAfterMs the time until then, so a client of
//     the protocol before the extension never sees a status it cannot read
//     and never runs a dead key's handler. The expiry is the record's last
//     write (the Fail) plus [Config.Retention].
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
// With admin (the operators' side, same bearer auth): list answers
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
//   - Timestamps are RFC 3339 in UTC with up to nanosecond fractions, as
//     precise as the store keeps them.
//   - Discovery, /healthz, /readyz (which reads a key of the store) and
//     /metrics need no token: none of them holds a secret.
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
// answer, as in its body (invalid_json, ..., unauthorized, not_found,
// store_unavailable, internal_error), /readyz's 503 included
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
	"net/http"
	"slices"
	"strconv"
	"strings"
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
	tokens    atomic.Pointer[[][32]byte] // SHA-256 of each accepted token; nil: auth none, for good (the discovery document says so)
	discovery []byte                     // the discovery document, encoded once
	metrics   http.Handler
	draining  atomic.Bool

	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec

	ops map[string]operation // the POSTed operations of protocol v1, by path
}

// operation is one POSTed operation of protocol v1: its endpoint label and
// its handler of the request body.
type operation struct {
	ep string
	f  func(ctx context.Context, body []byte) reply
}

// New returns the handler for cfg. It fails with an error wrapping
// [ErrInvalidConfig] that lists every problem of cfg, or with the error of
// registering the metrics.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger}
	s.ops = map[string]operation{
		wire.TryBegin: {epTryBegin, s.tryBegin}, wire.MarkProcessed: {epMark, s.markProcessed},
		wire.Release: {epRelease, s.release}, wire.Extend: {epExtend, s.extend}, wire.Fail: {epFail, s.fail},
		wire.List: {epList, s.list}, wire.Forget: {epForget, s.forget}, wire.ForceRelease: {epForce, s.forceRelease},
	}
	extensions := wire.Extensions
	if a, ok := cfg.Store.(inbox.Admin); ok {
		s.admin = a
	} else {
		extensions = slices.DeleteFunc(slices.Clone(extensions), func(e string) bool { return e == wire.ExtAdmin })
	}
	tokens := cfg.Tokens
	if cfg.Token != "" {
		tokens = append([]string{cfg.Token}, tokens...)
	}
	auth := wire.AuthNone
	if len(tokens) > 0 {
		auth = wire.AuthBearer
		s.storeTokens(tokens)
	}
	doc, err := json.Marshal(wire.DiscoveryResponse{
		Version: wire.Version,
		Auth:    auth,
		LeaseSeconds: wire.LeaseRange{
			Min: int64(cfg.LeaseMin / time.Second), Max: int64(cfg.LeaseMax / time.Second),
			Default: int64(cfg.LeaseDefault / time.Second),
		},
		LeasePolicy: string(cfg.LeasePolicy),
		Extensions:  extensions,
	})
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
	code   int
	body   any    // encoded as JSON
	status string // v1 status or error code, for metrics and logs
	key    string // for debug logs
	err    error  // a store failure, logged
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
	case path == wire.Discovery:
		ep = epDiscovery
		if !s.method(w, r, &rep, http.MethodGet) {
			break
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(s.discovery)
		s.done(r, ep, start, reply{code: http.StatusOK, status: statusOK})
		return
	case path == "/healthz":
		ep = epHealthz
		if s.method(w, r, &rep, http.MethodGet) {
			rep = reply{code: http.StatusOK, body: map[string]string{"status": statusOK}, status: statusOK}
		}
	case path == "/readyz":
		ep = epReadyz
		if s.method(w, r, &rep, http.MethodGet) {
			rep = s.ready(r.Context())
		}
	case path == "/metrics":
		ep = epMetrics
		if !s.method(w, r, &rep, http.MethodGet) {
			break
		}
		s.metrics.ServeHTTP(w, r)
		s.done(r, ep, start, reply{code: http.StatusOK, status: statusOK})
		return
	case r.Method == http.MethodPost && isOp:
		ep, rep = op.ep, s.post(w, r, op.f)
	case strings.HasPrefix(path, wire.KeyPrefix):
		ep = epGet
		if s.method(w, r, &rep, http.MethodGet) && s.authorized(w, r, &rep) {
			ctx, cancel := context.WithTimeout(r.Context(), s.cfg.StoreTimeout)
			rep = s.get(ctx, path, acceptDead(r))
			cancel()
		}
	default:
		ep = epOther
		rep = errReply(http.StatusNotFound, wire.CodeNotFound, fmt.Sprintf("no endpoint %s %s in protocol v1", r.Method, path))
	}
	s.write(w, rep)
	s.done(r, ep, start, rep)
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

// authorized checks the bearer token, setting a 401 reply when it is missing
// or wrong. Comparison is in constant time over hashes, so neither the token
// nor its length leaks through timing.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request, rep *reply) bool {
	accepted := s.tokens.Load()
	if accepted == nil {
		return true
	}
	h := r.Header.Get("Authorization")
	scheme, tok, _ := strings.Cut(h, " ")
	got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	match := 0
	for _, want := range *accepted {
		match |= subtle.ConstantTimeCompare(got[:], want[:])
	}
	if strings.EqualFold(scheme, "Bearer") && match == 1 {
		return true
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="inbox"`)
	msg := "missing bearer token"
	if h != "" {
		msg = "wrong bearer token"
	}
	*rep = errReply(http.StatusUnauthorized, wire.CodeUnauthorized, msg)
	return false
}

// SetTokens replaces the accepted bearer tokens, while serving: requests
// that start after it returns are checked against tokens only. It fails,
// changing nothing, with an error wrapping [ErrInvalidConfig] when tokens is
// empty or holds an empty token, or when the server was made without a
// token (its discovery document says auth none; make a new server to turn
// auth on). It never quotes a token.
func (s *Server) SetTokens(tokens ...string) error {
	if s.tokens.Load() == nil {
		return fmt.Errorf("%w: SetTokens on a server made without a token (auth none)", ErrInvalidConfig)
	}
	if len(tokens) == 0 {
		return fmt.Errorf("%w: SetTokens with no token would refuse every client", ErrInvalidConfig)
	}
	for i, t := range tokens {
		if t == "" {
			return fmt.Errorf("%w: SetTokens: token %d is empty", ErrInvalidConfig, i)
		}
	}
	s.storeTokens(tokens)
	return nil
}

func (s *Server) storeTokens(tokens []string) {
	hashes := make([][32]byte, len(tokens))
	for i, t := range tokens {
		hashes[i] = sha256.Sum256([]byte(t))
	}
	s.tokens.Store(&hashes)
}

// post reads the body of a POST endpoint and calls f with it.
func (s *Server) post(w http.ResponseWriter, r *http.Request, f func(ctx context.Context, body []byte) reply) reply {
	var rep reply
	if !s.authorized(w, r, &rep) {
		return rep
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
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.StoreTimeout)
	defer cancel()
	return f(ctx, body)
}

func decodeReply(err error) reply {
	var de *wire.DecodeError
	if errors.As(err, &de) {
		return errReply(http.StatusBadRequest, de.Code, de.Message)
	}
	return errReply(http.StatusBadRequest, wire.CodeInvalidJSON, err.Error())
}

func (s *Server) checkKey(key string) *reply {
	if len(key) > s.cfg.MaxKeyBytes {
		r := errReply(http.StatusBadRequest, wire.CodeInvalidKey,
			fmt.Sprintf("key is %d bytes, longer than the server's limit of %d", len(key), s.cfg.MaxKeyBytes))
		return &r
	}
	if err := inbox.ValidateKey(key); err != nil {
		r := s.storeReply(err)
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
	if r := s.checkKey(req.Key); r != nil {
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
	c, err := s.cfg.Store.TryBegin(ctx, req.Key, opts)
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
func (s *Server) leaseBody(body []byte, leaseOptional bool) (wire.LeaseRequest, *reply) {
	req, err := wire.DecodeLease(body)
	if err != nil {
		r := decodeReply(err)
		return req, &r
	}
	if r := s.checkKey(req.Key); r != nil {
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
	req, bad := s.leaseBody(body, true)
	if bad != nil {
		return *bad
	}
	var err error
	if req.LeaseID == "" {
		err = s.cfg.Store.MarkProcessed(ctx, req.Key)
	} else {
		err = s.cfg.Store.Complete(ctx, req.Key, req.LeaseID)
	}
	return s.leaseOutcome(req.Key, err, wire.StatusProcessed, wire.StatusResponse{Status: wire.StatusProcessed})
}

func (s *Server) release(ctx context.Context, body []byte) reply {
	req, bad := s.leaseBody(body, false)
	if bad != nil {
		return *bad
	}
	err := s.cfg.Store.Release(ctx, req.Key, req.LeaseID)
	return s.leaseOutcome(req.Key, err, wire.StatusReleased, wire.StatusResponse{Status: wire.StatusReleased})
}

func (s *Server) extend(ctx context.Context, body []byte) reply {
	req, bad := s.leaseBody(body, false)
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
	if r := s.checkKey(key); r != nil {
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
	if r := s.checkKey(req.Key); r != nil {
		return *r
	}
	if err := inbox.ValidateLeaseID(req.LeaseID); err != nil {
		return s.storeReply(err)
	}
	opts := inbox.FailOptions{Dead: req.Dead, Reason: req.Reason}
	if req.RetryAfterMs != nil {
		if opts.RetryAfter, err = millis("retryAfterMs", *req.RetryAfterMs); err != nil {
			return errReply(http.StatusBadRequest, wire.CodeInvalidArgument, err.Error())
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
	return s.leaseOutcome(req.Key, err, ok, wire.StatusResponse{Status: ok})
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
func (s *Server) keyCall(body []byte, call func(key string) error, status string) reply {
	if s.admin == nil {
		return noAdmin()
	}
	req, err := wire.DecodeKey(body)
	if err != nil {
		return decodeReply(err)
	}
	if r := s.checkKey(req.Key); r != nil {
		return *r
	}
	if err := call(req.Key); err != nil {
		return s.storeFailure(req.Key, err)
	}
	return reply{code: http.StatusOK, body: wire.StatusResponse{Status: status}, status: status, key: req.Key}
}

func (s *Server) forget(ctx context.Context, body []byte) reply {
	return s.keyCall(body, func(key string) error { return s.admin.Forget(ctx, key) }, wire.StatusForgotten)
}

func (s *Server) forceRelease(ctx context.Context, body []byte) reply {
	return s.keyCall(body, func(key string) error { return s.admin.ForceRelease(ctx, key) }, wire.StatusReleased)
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
	if rep.code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
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
	case rep.code == http.StatusUnauthorized:
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "inbox server: unauthorized request", attrs...)
	case rep.code >= 400:
		s.log.LogAttrs(r.Context(), slog.LevelInfo, "inbox server: request refused", attrs...)
	default:
		if s.log.Enabled(r.Context(), slog.LevelDebug) {
			s.log.LogAttrs(r.Context(), slog.LevelDebug, "inbox server: request", append(attrs, slog.String("key", rep.key))...)
		}
	}
}
