package server

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

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
)

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
	// itself. The server uses it only to tell a client that does not read
	// the status Dead (a try-begin without acceptDead, a GET without
	// ?acceptDead=true) when a dead key's record expires: such a client is
	// told Busy, or InProgress, until then. Optional; default
	// inbox.DefaultRetention, every store's default.
	Retention time.Duration

	// Token turns bearer authentication on: every call but discovery,
	// /healthz, /readyz and /metrics must carry "Authorization: Bearer
	// <Token>", else the answer is 401. Optional; default "" (auth none).
	// The token is never logged.
	Token string

	// Tokens are more accepted bearer tokens, beside Token: for a rotation
	// without downtime, accept the old and the new one, move the clients,
	// then drop the old one ([Server.SetTokens] changes the set while
	// serving). Any token turns auth on. Optional; none may be empty.
	Tokens []string

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
	if c.StoreTimeout == 0 {
		c.StoreTimeout = DefaultStoreTimeout
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

// Validate reports every problem of c (after defaults), joined, each wrapping
// [ErrInvalidConfig]. It never quotes Token or Tokens.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if c.Store == nil {
		bad("Store is required")
	}
	for i, t := range c.Tokens {
		if t == "" {
			bad("Tokens[%d] is empty", i)
		}
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
