// Command inboxd is the reference server of the remote inbox protocol v1
// (package [github.com/watermill-inbox/inbox/stores/remote/server]) over
// any store this project ships, chosen by URL.
//
// Configuration comes from the environment; each variable has a flag of the
// same meaning, which wins (inboxd -h lists the flags):
//
//	INBOX_STORE_URL        -store           store URL (memory://, redis://..., postgres://...); default memory://
//	INBOX_LISTEN_ADDR      -listen          listen address; default 127.0.0.1:8080
//	INBOX_TOKEN            (no flag)        bearer token; turns auth on (flags show in process lists)
//	INBOX_TOKEN_FILE       -token-file      file of the consumers' bearer tokens, one a line, each optionally limited to key prefixes (see Tokens)
//	INBOX_ADMIN_TOKEN_FILE -admin-token-file file of the operators' bearer tokens, one a line: list, forget, force-release (see Tokens)
//	INBOX_ALLOW_NO_AUTH    -allow-no-auth   true: serve without a token on an address that is not loopback; default false
//	INBOX_ALLOWED_HOSTS    -allowed-hosts   without a token: host names and addresses, comma-separated, that requests may name besides loopback ones
//	INBOX_METRICS_OPEN     -metrics-open    true: serve /metrics without a token; default false
//	INBOX_MAX_RETRY_AFTER  -max-retry-after longest backoff of a failed attempt (fail's retryAfterMs); default 24h
//	INBOX_TLS_CERT_FILE    -tls-cert        PEM certificate (chain) to serve HTTPS with; needs the key
//	INBOX_TLS_KEY_FILE     -tls-key         PEM private key of that certificate
//	INBOX_LEASE_MIN        -lease-min       shortest lease granted; default 30s
//	INBOX_LEASE_MAX        -lease-max       longest lease granted; default 120s
//	INBOX_LEASE_DEFAULT    -lease-default   lease when a call names none; default 30s
//	INBOX_LEASE_POLICY     -lease-policy    clamp or reject leases outside the range; default clamp
//	INBOX_MAX_BODY_BYTES   -max-body-bytes  request body limit; default 16384
//	INBOX_MAX_KEY_BYTES    -max-key-bytes   key length limit; default 1024
//	INBOX_STORE_TIMEOUT    -store-timeout   bound on each store call of a request; default 10s
//	INBOX_LOG_LEVEL        -log-level       debug, info, warn or error; default info
//	INBOX_SHUTDOWN_TIMEOUT -shutdown-timeout time to finish requests in flight on SIGTERM; default 30s
//	INBOX_MAX_RECORDS_PER_TOKEN -max-records-per-token live records a token may have in the store; default 1000000 (see Limits)
//	INBOX_RATE_LIMIT       -rate-limit      requests a second a token may make; default 0: no limit
//	INBOX_AUTH_FAILURES_PER_MINUTE -auth-failures-per-minute wrong tokens a client address may send a minute; default 60, negative: no limit
//
// Retention is the store's: a URL parameter of INBOX_STORE_URL
// (memory://?retention=7d). inboxd reads it too, to tell clients that do
// not read the status Dead when a dead key's record expires (see below).
// The store URL's check parameter is honoured:
// by default inboxd checks at start that its store works, and exits with
// the reason if it does not; check=false starts it anyway (/readyz then
// answers 503 until the store does).
//
// # Tokens
//
// A token is any string of at least 16 bytes without spaces or line breaks
// that clients send as "Authorization: Bearer <token>"; make one with 32
// random bytes:
//
//	mkdir -p "$HOME/.config/inboxd"
//	head -c 32 /dev/urandom | base64 > "$HOME/.config/inboxd/token"
//	chmod 600 "$HOME/.config/inboxd/token"
//
// and give the same file to inboxd (INBOX_TOKEN_FILE) and to the clients
// (the remote store URL's token_file=). A token holds no spaces; after it, a
// line may name the key prefixes the token may touch, as fields
// prefix=<key prefix>:
//
//	3tX...billing-token... prefix=rabbit:billing: prefix=kafka:billing:
//	9fQ...shipping-token... prefix=rabbit:shipping:
//	Kd2...unlimited-token...
//
// A prefix ends with ':' (prefix=app would reach apple:1). A call with a
// limited token on a key outside its prefixes (GET included, but for the
// key inbox-remote:check, which the remote client's check at Open reads)
// is answered 403 forbidden. A file with a shorter token, a token
// repeated, a prefix without ':', or a line with another field after the
// token is refused, naming the line, never the token. inboxd warns at
// start and at each reload when a token file's group or others may read or
// write it.
//
// The operators' calls, list, forget and force-release (the admin
// extension: cmd/inboxctl over an http:// store URL), need a token of their
// own, from INBOX_ADMIN_TOKEN_FILE (one a line, no prefixes; made as
// above). A consumer's token is answered 403 there; an admin token is
// accepted on every endpoint, for every key, so inboxctl needs only it. A
// token in both files is refused. Without INBOX_ADMIN_TOKEN_FILE, the admin
// endpoints are off (403; the discovery document leaves the admin
// extension out), except on an inboxd without any token on a loopback
// address, where they are served to every local caller, as every other call
// is.
//
// Without a token, auth is none: inboxd then serves only on a loopback
// address (127.0.0.1, ::1, localhost) unless INBOX_ALLOW_NO_AUTH=true says
// that the network it listens on is private. Any local program may then
// call it, but no web page: inboxd refuses (403) every request, but
// /healthz and /readyz, that carries an Origin header (a browser's
// cross-site request, such as a form's POST) or whose Host header is not
// localhost, an address of 127.0.0.0/8 or ::1, with or without port (DNS
// rebinding: a page whose own name was made to point at 127.0.0.1), or
// that a proxy relayed (Forwarded, X-Forwarded-* or X-Real-IP: behind a
// reverse proxy, a server without tokens is open to the proxy's clients).
// With INBOX_ALLOW_NO_AUTH=true on another address, INBOX_ALLOWED_HOSTS must
// list the names and addresses the clients use to reach inboxd
// (inboxd.internal,10.0.0.5): inboxd refuses to start without it.
//
// Every POST must say Content-Type: application/json (415 otherwise), so a
// form or text/plain POST never reaches an operation; a body that is not
// valid UTF-8 or names a member twice is 400.
//
// Without a certificate, inboxd serves plain HTTP, and a bearer token
// crosses the network in clear: give it INBOX_TLS_CERT_FILE and
// INBOX_TLS_KEY_FILE, or put it behind a proxy that terminates TLS, when
// clients reach it over a network. inboxd logs a warning at start when it
// serves tokens over plain HTTP on an address that is not loopback, and the
// remote client refuses to send its token over http:// to a host that is
// not loopback unless its URL says insecure=true.
//
// On SIGHUP, inboxd reads the token files and the certificate and key
// again, without dropping a connection: a renewed certificate serves the
// next TLS handshakes, and the files' tokens are the accepted ones for the
// next requests. To rotate a token without refused requests, add the new
// token as a second line, send SIGHUP, move the clients to it, remove the
// old line and send SIGHUP again. A file that cannot be read, holds no
// token, a token in both files, or a certificate that does not load is
// logged as an error and the previous ones kept. Auth cannot be turned on
// or off by a reload, nor can the admin endpoints (clients read both from
// the discovery document): restart inboxd for that.
//
// Endpoints: protocol v1 under /v1/inbox, /healthz (the process is up),
// /readyz (the store answers; 503 while shutting down), /metrics
// (Prometheus). /healthz and /readyz answer without a token, for probes and
// load balancers: they say only up and ready. /metrics needs a token (a
// consumer's or an admin's) when consumers need one, unless
// INBOX_METRICS_OPEN=true. Logs are JSON lines on stderr; they never hold
// a token, the store URL in them is redacted (passwords and secret-bearing
// parameters such as token or MongoDB's authMechanismProperties masked), and
// durations in them are strings as Go prints them ("30s", "1.5ms"), not
// nanoseconds. The start line says auth (bearer or none), admin (token,
// open or off) and metrics (token or open).
//
// Besides the ADR's try-begin, mark-processed, release and GET, and the
// extend extension, the discovery document (GET /v1/inbox) lists two
// extensions (stores/remote/openapi.yaml has their exact form):
//
//   - fail: POST /v1/inbox/fail ends a failed attempt under its lease with
//     a backoff (the key is Busy until it ends) or dead; try-begin answers
//     attempts, and Dead (with the reason) to a request with acceptDead;
//     GET answers reason and retryAt, and Dead with ?acceptDead=true. A
//     client that does not say acceptDead (one older than the extension) is
//     told Busy, and InProgress, until the dead record expires (its last
//     write plus the store URL's retention, 7 days without one), so it
//     never runs a dead key's handler.
//   - admin: POST /v1/inbox/list, /v1/inbox/forget and
//     /v1/inbox/force-release, the operators' side (cmd/inboxctl over an
//     http:// store URL), under an admin token (see Tokens).
//
// A failed attempt's backoff (fail's retryAfterMs) is at most
// INBOX_MAX_RETRY_AFTER (24 h by default; the discovery document's
// maxRetryAfterMs): a longer one is clamped to it, or refused with 400
// under INBOX_LEASE_POLICY=reject, as leases outside their range are.
//
// # Limits
//
// A call over a limit is answered 429 with Retry-After (whole seconds) and
// changes nothing; the remote client waits and retries when that is at most
// 5 s, else fails at once, and the middleware then nacks and backs off.
// Tokens limited to the same prefixes (a rotation's old and new token)
// count as one token; tokens without prefixes as one more.
//
//   - Live records (429 quota_exceeded): a token's share of the store. On
//     a memory:// store, whose max_entries (1000000 by default) is the
//     number of records it keeps before it evicts the least recently
//     written, inboxd shares max_entries equally among the tokens' prefix
//     sets once there are two, and refuses a new key past a token's share
//     or past max_entries: no token's keys can evict another's processed
//     keys. Size max_entries for every tenant's keys within the retention.
//     On any other store each token may have 1000000 live records
//     (server.DefaultMaxRecordsPerToken). INBOX_MAX_RECORDS_PER_TOKEN sets
//     the share instead, on any store; negative, no bound. inboxd counts
//     records in its memory since its start (about 100 bytes each); admin
//     tokens have no share but count in max_entries.
//   - Request rate (429 rate_limited): INBOX_RATE_LIMIT requests a second
//     per token, in bursts of a second's worth; admin tokens are not
//     limited.
//   - Failed authentications (429 too_many_auth_failures): past
//     INBOX_AUTH_FAILURES_PER_MINUTE wrong tokens from a client address (an
//     IPv6 /64), its requests that need a token are refused, the token
//     unchecked, until the budget refills. Behind a reverse proxy every
//     client has the proxy's address.
//
// # Metrics
//
// inbox_server_requests_total{endpoint, code, status} counts answers;
// inbox_server_request_duration_seconds{endpoint} times them. endpoint is
// try-begin, mark-processed, release, extend, fail, list, forget,
// force-release, get, discovery, healthz, readyz, metrics or other (an
// unknown path). code is the HTTP status code. status says what the answer
// was, in one vocabulary across endpoints:
//
//   - a 200 answer of the protocol: its v1 status, as in its body: Acquired,
//     Processed, Busy or Dead (try-begin); Processed or LeaseLost
//     (mark-processed); Released or LeaseLost (release); Extended or
//     LeaseLost (extend); Released, Dead or LeaseLost (fail); Forgotten
//     (forget); Released (force-release); NotFound, Available, InProgress,
//     Processed or Dead (get);
//   - a 200 answer without a v1 status (discovery, list, healthz, readyz,
//     metrics): OK;
//   - an error (4xx, 5xx): its error code, as in the error field of its
//     body: invalid_json, invalid_key, invalid_lease, invalid_lease_id,
//     invalid_argument, body_too_large, unauthorized, forbidden, not_found,
//     method_not_allowed, unsupported_media_type, not_supported,
//     store_unavailable, internal_error, quota_exceeded, rate_limited,
//     too_many_auth_failures;
//     /readyz answers 503 with store_unavailable, or draining while inboxd
//     shuts down.
//
// So a 200 always has a PascalCase status and an error a snake_case code:
// rate(inbox_server_requests_total{status="unauthorized"}[5m]) finds clients
// with a wrong token, {status="forbidden"} tokens used beyond their rights
// (and web pages knocking), {status="store_unavailable"} a failing store.
//
// On SIGTERM or SIGINT, inboxd stops accepting connections, lets the
// requests in flight finish (up to the shutdown timeout), closes the store
// and exits 0.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/watermill-inbox/inbox/stores"
	_ "github.com/watermill-inbox/inbox/stores/all"
	"github.com/watermill-inbox/inbox/stores/memory"
	"github.com/watermill-inbox/inbox/stores/remote/server"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stderr, nil, hup)
	stop()
	var usageErr *usageError
	switch {
	case errors.Is(err, flag.ErrHelp):
		usage(os.Stdout)
	case errors.As(err, &usageErr):
		fmt.Fprintf(os.Stderr, "inboxd: %v\nRun inboxd -h for the flags.\n", err)
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "inboxd:", err)
		os.Exit(1)
	}
}

// usageError is a flag or an argument inboxd does not take: exit 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }

// usage writes what inboxd -h prints: the flags with their built-in
// defaults (never the environment's: a store URL may hold a password).
func usage(w io.Writer) {
	s, hosts, _ := fromEnv(func(string) string { return "" })
	fs := flags(&s, &hosts)
	fs.SetOutput(w)
	fmt.Fprint(w, `Usage: inboxd [flags]

inboxd serves the remote inbox protocol v1 over the store of -store. Each
flag has an environment variable, named in its line; the flag wins over it.
INBOX_TOKEN (no flag, as flags show in process lists) is a bearer token.
go doc ./cmd/inboxd and docs/inboxd.md say more.

Flags:
`)
	fs.PrintDefaults()
}

// settings are inboxd's configuration after env and flags.
type settings struct {
	storeURL, listen, tokenFile, policy, logLevel string
	adminTokenFile                                string
	tlsCert, tlsKey                               string
	grants                                        []server.Grant // from INBOX_TOKEN or the token file
	adminTokens                                   []string       // from the admin token file
	allowedHosts                                  []string
	allowNoAuth, metricsOpen                      bool
	leaseMin, leaseMax, leaseDefault, shutdown    time.Duration
	storeTimeout, maxRetryAfter                   time.Duration
	maxBody                                       int64
	maxKey                                        int
	maxRecords, authFailures                      int              // per token; per client address and minute
	rateLimit                                     float64          // requests a second per token
	cert                                          *tls.Certificate // loaded from tlsCert and tlsKey
	warnings                                      []string         // logged once the logger exists
}

// auth is what the listening line says of the consumers' auth.
func (s settings) auth() string {
	if len(s.grants) > 0 {
		return "bearer"
	}
	return "none"
}

// adminNoAuth reports whether the admin endpoints are served without a
// token: only with no token at all, on a loopback address.
func (s settings) adminNoAuth() bool {
	return len(s.grants) == 0 && len(s.adminTokens) == 0 && loopback(s.listen)
}

// parse reads the environment, then the flags over it.
func parse(args []string, getenv func(string) string) (settings, error) {
	s, hosts, err := fromEnv(getenv)
	if err != nil {
		return s, err
	}
	fs := flags(&s, &hosts)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return s, err
		}
		return s, &usageError{err}
	}
	if fs.NArg() > 0 {
		return s, &usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	return s, s.finish(getenv, hosts)
}

// fromEnv is the settings the environment gives (the built-in defaults
// for the variables it does not set), and INBOX_ALLOWED_HOSTS.
func fromEnv(getenv func(string) string) (settings, string, error) {
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	var errs []error
	dur := func(name, def string) time.Duration {
		v := env(name, def)
		d, err := time.ParseDuration(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q is not a duration like 30s", name, v))
		}
		return d
	}
	num := func(name string, def int64) int64 {
		v := env(name, strconv.FormatInt(def, 10))
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q is not a whole number", name, v))
		}
		return n
	}
	s := settings{
		storeURL:       env("INBOX_STORE_URL", "memory://"),
		listen:         env("INBOX_LISTEN_ADDR", "127.0.0.1:8080"),
		tokenFile:      env("INBOX_TOKEN_FILE", ""),
		adminTokenFile: env("INBOX_ADMIN_TOKEN_FILE", ""),
		tlsCert:        env("INBOX_TLS_CERT_FILE", ""),
		tlsKey:         env("INBOX_TLS_KEY_FILE", ""),
		policy:         env("INBOX_LEASE_POLICY", string(server.PolicyClamp)),
		logLevel:       env("INBOX_LOG_LEVEL", "info"),
		leaseMin:       dur("INBOX_LEASE_MIN", server.DefaultLeaseMin.String()),
		leaseMax:       dur("INBOX_LEASE_MAX", server.DefaultLeaseMax.String()),
		leaseDefault:   dur("INBOX_LEASE_DEFAULT", server.DefaultLeaseDefault.String()),
		shutdown:       dur("INBOX_SHUTDOWN_TIMEOUT", "30s"),
		storeTimeout:   dur("INBOX_STORE_TIMEOUT", server.DefaultStoreTimeout.String()),
		maxRetryAfter:  dur("INBOX_MAX_RETRY_AFTER", server.DefaultMaxRetryAfter.String()),
		maxBody:        num("INBOX_MAX_BODY_BYTES", server.DefaultMaxBodyBytes),
		maxKey:         int(num("INBOX_MAX_KEY_BYTES", 1024)),
		maxRecords:     int(num("INBOX_MAX_RECORDS_PER_TOKEN", 0)),
		authFailures:   int(num("INBOX_AUTH_FAILURES_PER_MINUTE", server.DefaultAuthFailuresPerMinute)),
	}
	if v := env("INBOX_RATE_LIMIT", "0"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("INBOX_RATE_LIMIT=%q is not a number of requests a second", v))
		}
		s.rateLimit = f
	}
	for name, dst := range map[string]*bool{"INBOX_ALLOW_NO_AUTH": &s.allowNoAuth, "INBOX_METRICS_OPEN": &s.metricsOpen} {
		if v := getenv(name); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s=%q is not true or false", name, v))
			}
			*dst = b
		}
	}
	return s, env("INBOX_ALLOWED_HOSTS", ""), errors.Join(errs...)
}

// finish reads the token files and the certificate that s names, and
// checks that s is a configuration inboxd serves.
func (s *settings) finish(getenv func(string) string, hosts string) error {
	for _, h := range strings.Split(hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			s.allowedHosts = append(s.allowedHosts, h)
		}
	}
	token := getenv("INBOX_TOKEN")
	if token != "" && s.tokenFile != "" {
		return errors.New("give INBOX_TOKEN or INBOX_TOKEN_FILE (-token-file), not both")
	}
	if token != "" {
		if len(token) < server.MinTokenBytes {
			return fmt.Errorf("INBOX_TOKEN is %d bytes, shorter than the %d bytes a token must have: make one with: head -c 32 /dev/urandom | base64", len(token), server.MinTokenBytes)
		}
		s.grants = []server.Grant{{Token: token}}
	}
	if s.tokenFile != "" {
		var err error
		if s.grants, err = readGrants(s.tokenFile); err != nil {
			return err
		}
		s.warnings = append(s.warnings, openToOthers(s.tokenFile, "INBOX_TOKEN_FILE")...)
	}
	if s.adminTokenFile != "" {
		var err error
		if s.adminTokens, err = readAdminTokens(s.adminTokenFile); err != nil {
			return err
		}
		s.warnings = append(s.warnings, openToOthers(s.adminTokenFile, "INBOX_ADMIN_TOKEN_FILE")...)
		if err := disjoint(s.grants, s.adminTokens); err != nil {
			return err
		}
	}
	if len(s.grants) == 0 && !s.allowNoAuth && !loopback(s.listen) {
		return fmt.Errorf("no bearer token is configured and the listen address %q is not loopback: anyone who reaches it could read keys and mark them processed. "+
			"Give a token file (INBOX_TOKEN_FILE; make one with: %s), or listen on 127.0.0.1, or set INBOX_ALLOW_NO_AUTH=true (-allow-no-auth) if only trusted clients can reach that network",
			s.listen, makeToken("$HOME/.config/inboxd/token"))
	}
	if len(s.grants) == 0 && !loopback(s.listen) && len(s.allowedHosts) == 0 {
		return fmt.Errorf("no bearer token is configured and the listen address %q is not loopback: without tokens inboxd answers only requests whose Host is a loopback name or address "+
			"(so that no web page can reach it through DNS rebinding), which clients on other machines do not send. "+
			"Set INBOX_ALLOWED_HOSTS (-allowed-hosts) to the names and addresses clients use to reach it (comma-separated, such as inboxd.internal,10.0.0.5), or give a token file (INBOX_TOKEN_FILE)", s.listen)
	}
	if (s.tlsCert == "") != (s.tlsKey == "") {
		return fmt.Errorf("give both INBOX_TLS_CERT_FILE (-tls-cert) and INBOX_TLS_KEY_FILE (-tls-key), or neither; got cert %q, key %q", s.tlsCert, s.tlsKey)
	}
	if s.tlsCert != "" {
		var err error
		if s.cert, err = loadCert(s.tlsCert, s.tlsKey); err != nil {
			return err
		}
	}
	if s.shutdown <= 0 {
		return fmt.Errorf("shutdown timeout %s must be positive", s.shutdown)
	}
	return nil
}

// flags is inboxd's flag set over s, whose fields hold the defaults
// (the environment's, or the built-in ones); hosts is -allowed-hosts.
func flags(s *settings, hosts *string) *flag.FlagSet {
	fs := flag.NewFlagSet("inboxd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&s.storeURL, "store", s.storeURL, "store URL (INBOX_STORE_URL)")
	fs.StringVar(&s.listen, "listen", s.listen, "listen address (INBOX_LISTEN_ADDR)")
	fs.StringVar(&s.tokenFile, "token-file", s.tokenFile, "file of bearer tokens, one a line (INBOX_TOKEN_FILE)")
	fs.StringVar(&s.adminTokenFile, "admin-token-file", s.adminTokenFile, "file of the operators' bearer tokens, one a line (INBOX_ADMIN_TOKEN_FILE)")
	fs.StringVar(hosts, "allowed-hosts", *hosts, "host names besides loopback ones a server without tokens answers, comma-separated (INBOX_ALLOWED_HOSTS)")
	fs.BoolVar(&s.metricsOpen, "metrics-open", s.metricsOpen, "serve /metrics without a token (INBOX_METRICS_OPEN)")
	fs.DurationVar(&s.maxRetryAfter, "max-retry-after", s.maxRetryAfter, "longest backoff of a failed attempt (INBOX_MAX_RETRY_AFTER)")
	fs.StringVar(&s.tlsCert, "tls-cert", s.tlsCert, "PEM certificate to serve HTTPS with (INBOX_TLS_CERT_FILE)")
	fs.StringVar(&s.tlsKey, "tls-key", s.tlsKey, "PEM private key of the certificate (INBOX_TLS_KEY_FILE)")
	fs.StringVar(&s.policy, "lease-policy", s.policy, "clamp or reject (INBOX_LEASE_POLICY)")
	fs.StringVar(&s.logLevel, "log-level", s.logLevel, "debug, info, warn or error (INBOX_LOG_LEVEL)")
	fs.DurationVar(&s.leaseMin, "lease-min", s.leaseMin, "shortest lease (INBOX_LEASE_MIN)")
	fs.DurationVar(&s.leaseMax, "lease-max", s.leaseMax, "longest lease (INBOX_LEASE_MAX)")
	fs.DurationVar(&s.leaseDefault, "lease-default", s.leaseDefault, "default lease (INBOX_LEASE_DEFAULT)")
	fs.DurationVar(&s.storeTimeout, "store-timeout", s.storeTimeout, "bound on each store call (INBOX_STORE_TIMEOUT)")
	fs.DurationVar(&s.shutdown, "shutdown-timeout", s.shutdown, "time to finish requests in flight (INBOX_SHUTDOWN_TIMEOUT)")
	fs.Int64Var(&s.maxBody, "max-body-bytes", s.maxBody, "request body limit (INBOX_MAX_BODY_BYTES)")
	fs.IntVar(&s.maxKey, "max-key-bytes", s.maxKey, "key length limit (INBOX_MAX_KEY_BYTES)")
	fs.BoolVar(&s.allowNoAuth, "allow-no-auth", s.allowNoAuth, "serve without a token on an address that is not loopback (INBOX_ALLOW_NO_AUTH)")
	fs.IntVar(&s.maxRecords, "max-records-per-token", s.maxRecords, "live records each token may have in the store; 0: a memory store's max_entries shared among the tokens' prefixes, on other stores 1000000; negative: no bound (INBOX_MAX_RECORDS_PER_TOKEN)")
	fs.Float64Var(&s.rateLimit, "rate-limit", s.rateLimit, "requests a second each token may make; 0: no limit (INBOX_RATE_LIMIT)")
	fs.IntVar(&s.authFailures, "auth-failures-per-minute", s.authFailures, "requests with a wrong token a client address may make a minute; negative: no limit (INBOX_AUTH_FAILURES_PER_MINUTE)")
	return fs
}

// run serves until ctx ends, then shuts down gracefully. ready, when not
// nil, receives the listening address; each value on reload (SIGHUP in main)
// reads the token file and the certificate again.
func run(ctx context.Context, args []string, getenv func(string) string, logOut io.Writer, ready chan<- string, reload <-chan os.Signal) error {
	s, err := parse(args, getenv)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(s.logLevel)); err != nil {
		return fmt.Errorf("log level %q: want debug, info, warn or error", s.logLevel)
	}
	log := slog.New(slog.NewJSONHandler(logOut, &slog.HandlerOptions{Level: level, ReplaceAttr: durationString}))

	redacted := "(a URL that does not parse)" // never the raw URL: it may hold secrets
	if u, err := url.Parse(s.storeURL); err == nil {
		redacted = stores.Redact(u)
	}
	store, err := stores.Open(ctx, s.storeURL)
	if err != nil {
		return fmt.Errorf("opening the store: %w", err)
	}
	defer func() {
		if err := store.Close(); err != nil {
			log.Error("closing the store failed", slog.String("error", err.Error()))
		}
	}()
	h, err := server.New(server.Config{
		Store: store, Grants: s.grants, AdminTokens: s.adminTokens, AdminNoAuth: s.adminNoAuth(),
		AllowedHosts: s.allowedHosts, MetricsOpen: s.metricsOpen, Logger: log, Retention: storeRetention(s.storeURL),
		LeaseMin: s.leaseMin, LeaseMax: s.leaseMax, LeaseDefault: s.leaseDefault, LeasePolicy: server.LeasePolicy(s.policy),
		MaxBodyBytes: s.maxBody, MaxKeyBytes: s.maxKey, StoreTimeout: s.storeTimeout, MaxRetryAfter: s.maxRetryAfter,
		MaxRecordsPerToken: s.maxRecords, StoreCapacity: storeCapacity(s.storeURL), RequestsPerSecond: s.rateLimit,
		AuthFailuresPerMinute: s.authFailures,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.listen)
	if err != nil {
		return err
	}
	scheme := "http"
	var cert atomic.Pointer[tls.Certificate]
	if s.cert != nil {
		cert.Store(s.cert)
		ln = tls.NewListener(ln, &tls.Config{
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert.Load(), nil },
			MinVersion:     tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"},
		})
		scheme = "https"
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	admin, metrics := "off", "open"
	switch {
	case len(s.adminTokens) > 0:
		admin = "token"
	case s.adminNoAuth():
		admin = "open"
	}
	if len(s.grants) > 0 && !s.metricsOpen {
		metrics = "token"
	}
	log.Info("inboxd listening", slog.String("addr", ln.Addr().String()), slog.String("scheme", scheme), slog.String("store", redacted),
		slog.String("auth", s.auth()), slog.String("admin", admin), slog.String("metrics", metrics),
		slog.Duration("lease_min", s.leaseMin), slog.Duration("lease_max", s.leaseMax),
		slog.Duration("lease_default", s.leaseDefault), slog.String("lease_policy", s.policy), slog.Duration("max_retry_after", s.maxRetryAfter),
		slog.Int("store_capacity", storeCapacity(s.storeURL)), slog.Int("max_records_per_token", s.maxRecords),
		slog.Float64("rate_limit", s.rateLimit), slog.Int("auth_failures_per_minute", s.authFailures))
	if (len(s.grants) > 0 || len(s.adminTokens) > 0) && s.cert == nil && !loopback(s.listen) {
		log.Warn("inboxd serves bearer tokens over plain HTTP on an address that is not loopback: they cross the network in clear. "+
			"Give it a certificate (INBOX_TLS_CERT_FILE and INBOX_TLS_KEY_FILE), or put it behind a proxy that terminates TLS on the same machine",
			slog.String("addr", ln.Addr().String()))
	}
	for _, w := range s.warnings {
		log.Warn(w)
	}
	if ready != nil {
		ready <- ln.Addr().String()
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
wait:
	for {
		select {
		case err := <-served:
			return fmt.Errorf("serving: %w", err)
		case <-reload:
			reloadFiles(s, h, &cert, log)
		case <-ctx.Done():
			break wait
		}
	}
	log.Info("inboxd shutting down: finishing requests in flight", slog.Duration("timeout", s.shutdown))
	h.Drain()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.shutdown)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving: %w", err)
	}
	log.Info("inboxd stopped")
	return nil
}

// storeRetention is the retention parameter of a store URL, zero (the
// server's default, every store's) when it has none; the store, opened
// already, has refused a malformed one.
func storeRetention(raw string) time.Duration {
	u, err := url.Parse(raw)
	if err != nil {
		return 0
	}
	d, err := stores.PopDuration(u.Query(), "retention")
	if err != nil {
		return 0
	}
	return d
}

// storeCapacity is the number of records a store of URL raw keeps before
// it evicts: a memory store's max_entries (its default without one), zero
// for a store that does not evict (or a memory store without a bound).
func storeCapacity(raw string) int {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != memory.Scheme {
		return 0
	}
	n := memory.DefaultMaxEntries
	if v := u.Query().Get("max_entries"); v != "" {
		if n, err = strconv.Atoi(v); err != nil {
			return 0 // the store, opened already, has refused it
		}
	}
	return max(n, 0)
}

// loopback reports whether a listen address serves the local machine only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// makeToken is the shell command that makes a token file.
func makeToken(file string) string {
	q := shellQuote(file)
	return fmt.Sprintf("mkdir -p %s && head -c 32 /dev/urandom | base64 > %s && chmod 600 %s", shellQuote(filepath.Dir(file)), q, q)
}

// shellQuote quotes s for sh when it holds more than letters, digits and
// /._-+:=@,; "$HOME..." is kept in double quotes so that it expands.
func shellQuote(s string) string {
	if rest, ok := strings.CutPrefix(s, "$HOME/"); ok && !strings.ContainsAny(rest, "\"\\`$\n") {
		return `"` + s + `"`
	}
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+:=@,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// tokenFileHelp says what a token file holds and how to make one.
const tokenFileHelp = "a token file holds the bearer tokens clients must send, one a line, each optionally followed by prefix=<key prefix> fields that limit the keys it may touch (clients read the same file through the remote store URL's token_file=)"

// adminTokenFileHelp says what the admin token file holds.
const adminTokenFileHelp = "the admin token file holds the operators' bearer tokens, one a line, for list, forget and force-release (inboxctl reads it through the remote store URL's token_file=); no consumer's token may be among them"

// durationString makes the JSON handler write durations as strings ("30s",
// "1.5ms") instead of nanoseconds: whatever logs through inboxd's logger
// (its own lines, the server's, net/http's) reads the same.
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// readGrants reads a token file: one token a line, optionally followed by
// fields prefix=<key prefix> that limit the keys the token may touch;
// surrounding whitespace and blank lines are ignored. It never quotes the
// file's contents (a bad line is named by its number). Its errors say what
// the file holds and, when it is missing, how to make one.
func readGrants(file string) ([]server.Grant, error) {
	lines, err := readTokenLines(file, "INBOX_TOKEN_FILE", tokenFileHelp)
	if err != nil {
		return nil, err
	}
	grants := make([]server.Grant, 0, len(lines))
	for _, l := range lines {
		g := server.Grant{Token: l.fields[0]}
		for _, f := range l.fields[1:] {
			p, ok := strings.CutPrefix(f, "prefix=")
			if !ok || p == "" {
				return nil, fmt.Errorf("token file %q (INBOX_TOKEN_FILE), line %d: after the token, a line takes only prefix=<key prefix> fields (a token holds no spaces), and a prefix is not empty", file, l.n)
			}
			if !strings.HasSuffix(p, server.PrefixSeparator) {
				return nil, fmt.Errorf("token file %q (INBOX_TOKEN_FILE), line %d: prefix %q does not end with %q: without the separator the token reaches other namespaces' keys (prefix=app reaches apple:1); use %q",
					file, l.n, p, server.PrefixSeparator, p+server.PrefixSeparator)
			}
			g.Prefixes = append(g.Prefixes, p)
		}
		grants = append(grants, g)
	}
	return grants, nil
}

// readAdminTokens reads the admin token file: one token a line, without
// prefixes (an operator's token touches every key).
func readAdminTokens(file string) ([]string, error) {
	lines, err := readTokenLines(file, "INBOX_ADMIN_TOKEN_FILE", adminTokenFileHelp)
	if err != nil {
		return nil, err
	}
	tokens := make([]string, 0, len(lines))
	for _, l := range lines {
		if len(l.fields) > 1 {
			return nil, fmt.Errorf("admin token file %q (INBOX_ADMIN_TOKEN_FILE), line %d: one token a line, nothing after it (a token holds no spaces; admin tokens take no prefix)", file, l.n)
		}
		tokens = append(tokens, l.fields[0])
	}
	return tokens, nil
}

// disjoint refuses a token that is both a consumer's and an operator's: a
// consumer would hold the admin's power. It never quotes the token.
func disjoint(grants []server.Grant, admins []string) error {
	for i, g := range grants {
		if slices.Contains(admins, g.Token) {
			return fmt.Errorf("token %d of the token file (INBOX_TOKEN_FILE or INBOX_TOKEN) is also in the admin token file (INBOX_ADMIN_TOKEN_FILE): give operators tokens of their own", i+1)
		}
	}
	return nil
}

// openToOthers is the warning, if any, for a token file that its group
// or others may read or write: anyone who can read it can call inboxd as
// its tokens' holders.
func openToOthers(file, setting string) []string {
	fi, err := os.Stat(file)
	if err != nil || fi.Mode().Perm()&0o077 == 0 {
		return nil
	}
	return []string{fmt.Sprintf("token file %q (%s) has mode %04o: its group or others may read or change its tokens; chmod 600 %s",
		file, setting, fi.Mode().Perm(), shellQuote(file))}
}

// tokenLine is a line of a token file: its number and its fields.
type tokenLine struct {
	n      int
	fields []string
}

// readTokenLines reads the non-blank lines of a token file, split at
// whitespace, and refuses a file without any or repeating a token.
func readTokenLines(file, setting, help string) ([]tokenLine, error) {
	what := "token file"
	if setting == "INBOX_ADMIN_TOKEN_FILE" {
		what = "admin token file"
	}
	b, err := os.ReadFile(file)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			hint := ". Or leave INBOX_TOKEN_FILE unset to serve without auth on a loopback address"
			if setting == "INBOX_ADMIN_TOKEN_FILE" {
				hint = ". Or leave INBOX_ADMIN_TOKEN_FILE unset: the admin endpoints are then off (served without a token only by an inboxd without any token on a loopback address)"
			}
			return nil, fmt.Errorf("%s %q (%s) does not exist: %s. Make one with: %s%s", what, file, setting, help, makeToken(file), hint)
		}
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is quoted already
		}
		return nil, fmt.Errorf("%s %q (%s): %v; %s, and inboxd must be able to read it", what, file, setting, err, help)
	}
	var lines []tokenLine
	seen := map[string]int{}
	for i, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if first, dup := seen[f[0]]; dup {
			return nil, fmt.Errorf("%s %q (%s): line %d repeats the token of line %d", what, file, setting, i+1, first)
		}
		if len(f[0]) < server.MinTokenBytes {
			return nil, fmt.Errorf("%s %q (%s): the token of line %d is %d bytes, shorter than the %d bytes a token must have: make one with: head -c 32 /dev/urandom | base64",
				what, file, setting, i+1, len(f[0]), server.MinTokenBytes)
		}
		seen[f[0]] = i + 1
		lines = append(lines, tokenLine{n: i + 1, fields: f})
	}
	if len(lines) == 0 {
		return nil, fmt.Errorf("%s %q (%s) holds no token: %s. Make one with: head -c 32 /dev/urandom | base64 > %s",
			what, file, setting, help, shellQuote(file))
	}
	return lines, nil
}

func loadCert(certFile, keyFile string) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate %q with key %q: %w", certFile, keyFile, err)
	}
	return &cert, nil
}

// reloadFiles reads the token files and the certificate again (SIGHUP).
// What fails to load is logged and the previous one kept; the two token
// files are applied together or not at all.
func reloadFiles(s settings, h *server.Server, cert *atomic.Pointer[tls.Certificate], log *slog.Logger) {
	attrs := []any{}
	failed := false
	var warnings []string
	if s.tokenFile != "" || s.adminTokenFile != "" {
		err := func() error {
			grants, admins := s.grants, s.adminTokens
			var err error
			if s.tokenFile != "" {
				if grants, err = readGrants(s.tokenFile); err != nil {
					return err
				}
				warnings = append(warnings, openToOthers(s.tokenFile, "INBOX_TOKEN_FILE")...)
			}
			if s.adminTokenFile != "" {
				if admins, err = readAdminTokens(s.adminTokenFile); err != nil {
					return err
				}
				warnings = append(warnings, openToOthers(s.adminTokenFile, "INBOX_ADMIN_TOKEN_FILE")...)
			}
			if err := disjoint(grants, admins); err != nil {
				return err
			}
			setGrants := func() error {
				if s.tokenFile == "" {
					return nil
				}
				return h.SetGrants(grants...)
			}
			setAdmins := func() error {
				if s.adminTokenFile == "" {
					return nil
				}
				return h.SetAdminTokens(admins...)
			}
			// Each Set refuses a token that the other set holds. The new
			// sets are disjoint, so when the admins' fails, a token moves
			// from the consumers' file to the admins': replace the
			// consumers' first.
			if err := setAdmins(); err != nil {
				if err := setGrants(); err != nil {
					return err
				}
				if err := setAdmins(); err != nil {
					return err
				}
			} else if err := setGrants(); err != nil {
				return err
			}
			if s.tokenFile != "" {
				attrs = append(attrs, slog.Int("tokens", len(grants)))
			}
			if s.adminTokenFile != "" {
				attrs = append(attrs, slog.Int("admin_tokens", len(admins)))
			}
			return nil
		}()
		if err != nil {
			failed = true
			log.Error("inboxd reload: tokens kept as they were", slog.String("error", err.Error()))
		}
	}
	if s.tlsCert != "" {
		c, err := loadCert(s.tlsCert, s.tlsKey)
		if err != nil {
			failed = true
			log.Error("inboxd reload: certificate kept as it was", slog.String("error", err.Error()))
		} else {
			cert.Store(c)
			if c.Leaf != nil {
				attrs = append(attrs, slog.Time("cert_not_after", c.Leaf.NotAfter))
			}
		}
	}
	for _, w := range warnings {
		log.Warn(w)
	}
	attrs = append(attrs, slog.Bool("complete", !failed))
	log.Info("inboxd reloaded", attrs...)
}
