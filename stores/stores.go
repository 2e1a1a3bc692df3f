// Package stores opens inbox stores by URL, so that an application can swap
// stores through configuration:
//
//	store, err := stores.Open(ctx, os.Getenv("INBOX_STORE_URL")) // e.g. "redis://127.0.0.1:6379/0?retention=72h"
//	if err != nil { ... }
//	defer store.Close()
//
// Each driver registers its URL scheme when its package is imported, usually
// with a blank import (`import _ "github.com/watermill-inbox/inbox/stores/memory"`);
// package [github.com/watermill-inbox/inbox/stores/all] imports every driver
// this project ships.
//
// # Parameters
//
// The mux reads the parameters every store shares and removes them from the
// URL before the driver sees it:
//
//   - retention: how long a processed key stays processed, as a duration
//     ("7d", "168h", "1d12h", "30m"). Default: the driver's, normally
//     [inbox.DefaultRetention].
//   - lease: the lease length used when a caller asks for none ("30s").
//     Default: the driver's, normally [inbox.DefaultLease].
//   - check: true (the default) or false; see "Checks at Open" below.
//     [Params.Lazy] is its negation.
//
// Durations, here and in the drivers' own parameters (timeout, ...), are Go
// durations ([time.ParseDuration]: "ms", "s", "m", "h") that may start with a
// whole number of days: "7d", "1d12h". A day is 24 hours. They must be
// positive; see [PopDuration].
//
// Drivers read their own parameters (prefix, table, collection, ...) and
// reject any parameter they do not know, naming it: a typo never passes
// silently. Errors never quote a URL's password or token.
//
// # Checks at Open
//
// [Open] returns a store that works, or an error that says what is wrong and
// how to fix it: each driver connects, authenticates and checks that the
// table or collection it needs is there (or creates it when the URL asks, as
// with migrate=true or ensure_indexes=true); the driver's package
// documentation says what exactly. A mistake of configuration found this way
// (a wrong password, a missing table, a database that does not exist, a user
// without the rights the store needs) is an error wrapping both
// [ErrMisconfigured] and [inbox.ErrStoreUnavailable]; a server that does not
// answer in time, or at all, is an error wrapping [inbox.ErrStoreUnavailable]
// only, since it may come back.
//
// check=false opens lazily, for programs that start before their store (a
// container started with its database): the URL's parameters are still
// checked, but nothing is sent to the server, and the same mistakes then fail
// the store's first calls with [inbox.ErrStoreUnavailable]. Where a URL asks
// for work on a server at Open (migrate=true on PostgreSQL or MySQL,
// ensure_indexes=true), check=false is refused with it: that work needs the
// server. check=false is not the Redis driver's conn_check, which is about
// go-redis's pooled connections.
//
// Drivers registered by a program read [Params.Lazy] and should do the same.
// The memory store has nothing to check. Constructors that take the caller's
// own client (redisstore.New, sqlstore.New, mongostore.New) say in their
// documentation what they check.
package stores

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/watermill-inbox/inbox"
)

// shipped names the package of each driver this project ships, by scheme,
// for the error of a scheme that no driver registered.
var shipped = map[string]string{
	"memory":      "github.com/watermill-inbox/inbox/stores/memory",
	"redis":       "github.com/watermill-inbox/inbox/stores/redis",
	"rediss":      "github.com/watermill-inbox/inbox/stores/redis",
	"postgres":    "github.com/watermill-inbox/inbox/stores/sql/postgres",
	"postgresql":  "github.com/watermill-inbox/inbox/stores/sql/postgres",
	"mysql":       "github.com/watermill-inbox/inbox/stores/sql/mysql",
	"sqlite":      "github.com/watermill-inbox/inbox/stores/sql/sqlite",
	"mongodb":     "github.com/watermill-inbox/inbox/stores/mongo",
	"mongodb+srv": "github.com/watermill-inbox/inbox/stores/mongo",
	"http":        "github.com/watermill-inbox/inbox/stores/remote",
	"https":       "github.com/watermill-inbox/inbox/stores/remote",
}

// ErrUnknownScheme is wrapped when no driver is registered for a URL's scheme.
var ErrUnknownScheme = errors.New("stores: unknown URL scheme")

// ErrInvalidURL is wrapped when a URL cannot be parsed or holds a bad or
// unknown parameter.
var ErrInvalidURL = errors.New("stores: invalid store URL")

// ErrMisconfigured is wrapped, together with [inbox.ErrStoreUnavailable], by
// the error of an [Open] whose store answered but cannot work as configured:
// a wrong user or password, a database, table or collection that does not
// exist, a user without the rights the store needs. Unlike an outage, it
// does not go away by waiting: the URL or the server's configuration must
// change. It wraps no other error; see [Misconfigured].
var ErrMisconfigured = errors.New("stores: store misconfigured")

// Misconfigured returns an error wrapping [ErrMisconfigured] and
// [inbox.ErrStoreUnavailable], whose text is msg followed, when cause is
// not nil, by cause's text in parentheses. msg names what is wrong and how to
// fix it, and quotes no secret (use [Redact] for URLs); cause, the driver's
// error, stays in the chain for errors.As.
func Misconfigured(msg string, cause error) error {
	return &misconfigured{msg: msg, cause: cause}
}

type misconfigured struct {
	msg   string
	cause error
}

func (e *misconfigured) Error() string {
	if e.cause == nil {
		return e.msg
	}
	return e.msg + " (" + e.cause.Error() + ")"
}

func (e *misconfigured) Unwrap() []error {
	errs := []error{ErrMisconfigured, inbox.ErrStoreUnavailable}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}

// Store is what [Open] returns: a lease store that owns its connections and
// must be closed.
type Store interface {
	inbox.LeaseStore
	// Close releases what the store holds (connections, goroutines). A store
	// built over a client the caller passed in does not close that client.
	Close() error
}

// Params are the parameters the mux reads for every driver. Zero values mean
// the driver's default.
type Params struct {
	// Retention is the URL's retention parameter.
	Retention time.Duration
	// Lease is the URL's lease parameter.
	Lease time.Duration
	// Lazy is set by check=false: the opener must not contact the server
	// (see "Checks at Open" in the package documentation). By default
	// (false) it checks that the store works before returning it.
	Lazy bool
}

// Opener opens a store from a URL. The URL passed in has the shared
// parameters removed; the opener must reject the query parameters it does not
// know ([RejectUnknown] helps).
type Opener interface {
	OpenStore(ctx context.Context, u *url.URL, p Params) (Store, error)
}

// OpenerFunc adapts a function to [Opener].
type OpenerFunc func(ctx context.Context, u *url.URL, p Params) (Store, error)

// OpenStore calls f.
func (f OpenerFunc) OpenStore(ctx context.Context, u *url.URL, p Params) (Store, error) {
	return f(ctx, u, p)
}

// URLMux maps URL schemes to openers. The zero value is an empty mux ready to
// use; it is safe for concurrent use.
type URLMux struct {
	mu      sync.RWMutex
	openers map[string]Opener
}

// Register makes o open URLs with scheme (lower case, without "://"). It panics
// when the scheme is registered twice or o is nil: both are programming
// errors found at init.
func (m *URLMux) Register(scheme string, o Opener) {
	if o == nil {
		panic("stores: Register of a nil opener for scheme " + scheme)
	}
	scheme = strings.ToLower(scheme)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.openers == nil {
		m.openers = make(map[string]Opener)
	}
	if _, dup := m.openers[scheme]; dup {
		panic("stores: scheme " + scheme + " registered twice")
	}
	m.openers[scheme] = o
}

// Schemes returns the registered schemes, sorted.
func (m *URLMux) Schemes() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]string, 0, len(m.openers))
	for s := range m.openers {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// Open parses rawURL, reads the shared parameters and calls the opener
// registered for its scheme.
func (m *URLMux) Open(ctx context.Context, rawURL string) (Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error quotes the whole URL, password included, and its inner
		// error can quote a part of it (a password holding '#' or '/' ends up
		// in "invalid port"): with credentials in the URL, say only where.
		if strings.Contains(rawURL, "@") {
			return nil, fmt.Errorf("%w: cannot parse the URL (details withheld: it holds credentials; percent-escape special characters in the user and password)", ErrInvalidURL)
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("%w: %v", ErrInvalidURL, err)
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("%w: %q has no scheme (like memory:// or redis://); known schemes: %s",
			ErrInvalidURL, Redact(u), strings.Join(m.Schemes(), ", "))
	}
	scheme := strings.ToLower(u.Scheme)
	m.mu.RLock()
	o := m.openers[scheme]
	m.mu.RUnlock()
	if o == nil {
		hint := "is the driver imported?"
		if pkg, ok := shipped[scheme]; ok {
			hint = fmt.Sprintf("import _ %q to register it", pkg)
		}
		known := strings.Join(m.Schemes(), ", ")
		if known == "" {
			known = "none"
		}
		return nil, fmt.Errorf("%w %q (%s); known schemes: %s",
			ErrUnknownScheme, scheme, hint, known)
	}
	p, rest, err := readParams(u)
	if err != nil {
		return nil, err
	}
	return o.OpenStore(ctx, rest, p)
}

func readParams(u *url.URL) (Params, *url.URL, error) {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return Params{}, nil, fmt.Errorf("%w: query of %q: %v", ErrInvalidURL, Redact(u), err)
	}
	var p Params
	for name, dst := range map[string]*time.Duration{"retention": &p.Retention, "lease": &p.Lease} {
		v, err := PopDuration(q, name)
		if err != nil {
			return Params{}, nil, err
		}
		*dst = v
	}
	check, err := PopBool(q, "check", true)
	if err != nil {
		return Params{}, nil, err
	}
	p.Lazy = !check
	rest := *u
	rest.RawQuery = q.Encode()
	return p, &rest, nil
}

// PopDuration reads and removes the positive duration parameter name from q.
// A duration is what [ParseDuration] reads: a Go duration that may start
// with a whole number of days, a day being 24 hours: "30s", "168h", "7d",
// "1d12h30m". It returns zero when the parameter is absent, and an error
// wrapping [ErrInvalidURL], naming the parameter and its value, when it is
// repeated, unparsable, not positive or longer than a time.Duration holds
// (about 106751 days).
func PopDuration(q url.Values, name string) (time.Duration, error) {
	s, ok, err := PopString(q, name)
	if err != nil || !ok {
		return 0, err
	}
	d, err := ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%w: parameter %s=%q %v", ErrInvalidURL, name, s, err)
	}
	if d <= 0 {
		return 0, fmt.Errorf("%w: parameter %s=%q must be positive", ErrInvalidURL, name, s)
	}
	return d, nil
}

const day = 24 * time.Hour

// ParseDuration parses a duration of the store URLs: a Go duration
// ([time.ParseDuration]: "ms", "s", "m", "h") that may start with a whole
// number of days, a day being 24 hours: "30s", "168h", "7d", "1d12h30m".
// Like time.ParseDuration it takes zero and, without days, negative
// durations ("-5m"); a caller that wants a positive duration checks, as
// [PopDuration] does. Its error is a phrase that follows a quote of s, such
// as "is not a duration like 30s, 168h, 7d or 1d12h"; it never quotes s.
func ParseDuration(s string) (time.Duration, error) {
	const want = "is not a duration like 30s, 168h, 7d or 1d12h"
	i := strings.IndexByte(s, 'd')
	if i < 0 {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, errors.New(want)
		}
		return d, nil
	}
	// Days come first, as a whole number without sign: "7d", "1d12h".
	days, rest := s[:i], s[i+1:]
	if days == "" || strings.Trim(days, "0123456789") != "" {
		return 0, errors.New(want)
	}
	n, err := strconv.ParseInt(days, 10, 64)
	if err != nil || n > int64(math.MaxInt64/day) {
		return 0, errors.New("is longer than the longest duration, about 106751 days")
	}
	d := time.Duration(n) * day
	if rest == "" {
		return d, nil
	}
	if rest[0] == '+' || rest[0] == '-' || strings.IndexByte(rest, 'd') >= 0 {
		return 0, errors.New(want)
	}
	r, err := time.ParseDuration(rest)
	if err != nil {
		return 0, errors.New(want)
	}
	if r > math.MaxInt64-d {
		return 0, errors.New("is longer than the longest duration, about 106751 days")
	}
	return d + r, nil
}

// PopBool reads and removes the boolean parameter name from q (true or
// false, and the other forms of [strconv.ParseBool]). It returns def when
// the parameter is absent, and an error wrapping [ErrInvalidURL], naming the
// parameter and its value, when it is repeated or not a boolean.
func PopBool(q url.Values, name string, def bool) (bool, error) {
	s, ok, err := PopString(q, name)
	if err != nil || !ok {
		return def, err
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return def, fmt.Errorf("%w: parameter %s=%q is not true or false", ErrInvalidURL, name, s)
	}
	return b, nil
}

// PopString reads and removes the parameter name from q. ok is false when it
// is absent; repeating it is an error wrapping [ErrInvalidURL].
func PopString(q url.Values, name string) (v string, ok bool, err error) {
	vs, ok := q[name]
	if !ok {
		return "", false, nil
	}
	delete(q, name)
	if len(vs) != 1 {
		return "", false, fmt.Errorf("%w: parameter %s is given %d times", ErrInvalidURL, name, len(vs))
	}
	return vs[0], true, nil
}

// RejectUnknown returns an error wrapping [ErrInvalidURL] that names the
// parameters left in q, or nil when none is left. Drivers call it after
// popping the parameters they know.
func RejectUnknown(scheme string, q url.Values, known ...string) error {
	if len(q) == 0 {
		return nil
	}
	names := make([]string, 0, len(q))
	for n := range q {
		names = append(names, n)
	}
	slices.Sort(names)
	known = append([]string{"retention", "lease", "check"}, known...)
	return fmt.Errorf("%w: unknown parameter(s) %s for %s:// (known: %s)",
		ErrInvalidURL, strings.Join(names, ", "), scheme, strings.Join(known, ", "))
}

// secretWords are the words that mark a URL parameter as secret-bearing:
// a parameter whose lower-cased name contains one of them is masked
// (password, sslpassword, tlsCertificateKeyFilePassword, token, api_key,
// client_secret, ...).
var secretWords = []string{"token", "password", "secret", "key", "credential"}

// secretNames holds the lower-cased names of the parameters that drivers
// registered with [RegisterSecretParams]: parameters whose names say nothing
// of their secret, such as MongoDB's authMechanismProperties, which holds
// AWS_SESSION_TOKEN:<token>.
var secretNames sync.Map // string -> struct{}

// RegisterSecretParams records names as URL parameters that carry secrets,
// matched without regard to case, for every URL: [Redact] masks their
// values, [Scrub] removes them from messages. Drivers call it from init for
// each secret-bearing parameter of their URLs, whatever its name (a name
// holding token, password, secret, key or credential is secret already, but
// registering it says that the driver knows it is). It is safe for
// concurrent use.
func RegisterSecretParams(names ...string) {
	for _, n := range names {
		secretNames.Store(strings.ToLower(n), struct{}{})
	}
}

// SecretParam reports whether the URL parameter name carries a secret: its
// lower-cased name holds token, password, secret, key or credential, or a
// driver registered it ([RegisterSecretParams]). It is the one list that
// [Redact] and [Scrub] use.
func SecretParam(name string) bool {
	ln := strings.ToLower(name)
	if _, ok := secretNames.Load(ln); ok {
		return true
	}
	for _, w := range secretWords {
		if strings.Contains(ln, w) {
			return true
		}
	}
	return false
}

// Redact returns u as a string with any password replaced by "xxxxx" and the
// values of query parameters that carry secrets ([SecretParam]) masked, for
// logs and error messages. A query that does not parse is masked whole.
func Redact(u *url.URL) string {
	c := *u
	if c.User != nil {
		if _, has := c.User.Password(); has {
			c.User = url.UserPassword(c.User.Username(), "xxxxx")
		}
	}
	if c.RawQuery != "" {
		if q, err := url.ParseQuery(c.RawQuery); err == nil {
			for n := range q {
				if SecretParam(n) {
					q[n] = []string{"xxxxx"}
				}
			}
			c.RawQuery = q.Encode()
		} else {
			c.RawQuery = "xxxxx"
		}
	}
	s := c.String()
	// url.URL drops an empty authority ("memory://?x" prints "memory:?x"); keep
	// it, so that the URL reads as the user wrote it.
	if c.Opaque == "" && c.Host == "" && c.User == nil && c.Scheme != "" && !strings.HasPrefix(c.Path, "/") {
		s = c.Scheme + "://" + strings.TrimPrefix(s, c.Scheme+":")
	}
	return s
}

// Scrub returns msg (a driver's error text, which may quote parts of the
// URL) with u's password and the values of its secret-bearing query
// parameters ([SecretParam]) replaced by "xxxxx", in the forms a driver may
// quote them: as written, query-escaped and path-escaped.
func Scrub(msg string, u *url.URL) string {
	var secrets []string
	if u.User != nil {
		if pw, ok := u.User.Password(); ok {
			secrets = append(secrets, pw)
		}
	}
	if q, err := url.ParseQuery(u.RawQuery); err == nil {
		for n, vs := range q {
			if SecretParam(n) {
				secrets = append(secrets, vs...)
			}
		}
	} else if u.RawQuery != "" {
		secrets = append(secrets, u.RawQuery)
	}
	// Longest first, so that a secret holding another is masked whole.
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, s := range secrets {
		if s == "" {
			continue
		}
		for _, form := range []string{s, url.QueryEscape(s), url.PathEscape(s)} {
			msg = strings.ReplaceAll(msg, form, "xxxxx")
		}
	}
	return msg
}

var defaultMux URLMux

// DefaultURLMux returns the mux that drivers register with in their init
// functions and that [Open] uses.
func DefaultURLMux() *URLMux { return &defaultMux }

// Register registers o for scheme on the default mux. Drivers call it from
// init.
func Register(scheme string, o Opener) { defaultMux.Register(scheme, o) }

// Open opens a store by URL through the default mux. See the package
// documentation for the shared parameters.
func Open(ctx context.Context, rawURL string) (Store, error) {
	return defaultMux.Open(ctx, rawURL)
}
