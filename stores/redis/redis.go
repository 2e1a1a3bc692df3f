package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// Defaults of [Options].
const (
	// DefaultPrefix is the key prefix when Options.Prefix is empty.
	DefaultPrefix = "inbox:"

	// DefaultTimeout bounds each call when Options.Timeout is zero.
	DefaultTimeout = 5 * time.Second

	// MaxDuration is the longest lease or retention the store accepts: 100
	// years. Times are kept as microseconds in Lua numbers (doubles), exact
	// up to 2^53 µs (about 285 years after 1970).
	MaxDuration = 100 * 365 * 24 * time.Hour

	// MaxPrefixLen is the longest Options.Prefix, in bytes.
	MaxPrefixLen = 256

	// PrefixSeparator ends every Options.Prefix.
	PrefixSeparator = ":"
)

// Batching of the store's calls (see "Batched round trips" in the package
// documentation): at most maxBatch calls in one pipeline, maxQueue calls
// waiting. maxInFlight is two so that one consumer's claim (on its
// message's critical path) never waits behind the mark of its previous
// message (in the background): with one, such a claim waited for the
// mark's round trip and one consumer on Kafka lost a third of its
// throughput.
const (
	maxBatch    = 128
	maxQueue    = 4096
	maxInFlight = 2
)

// Options configure a [Store]. The zero value is usable: every field has a
// default.
type Options struct {
	// Prefix is prepended to every inbox key to make its Redis key, so one
	// Redis can hold several inboxes and other data. The store owns every
	// key under it: its List, Forget and every other call touch no key
	// outside it. It must end with ':' ([PrefixSeparator]), so that it ends
	// where a namespace ends: without the separator, Prefix "app" and the
	// inbox key "le:1" would make the Redis key "apple:1", another
	// application's ("apple:"). Two stores on one Redis must not use
	// prefixes one of which starts with the other ("inbox:" owns
	// "inbox:billing:..."). Optional; default [DefaultPrefix] ("inbox:");
	// at most [MaxPrefixLen] bytes.
	Prefix string

	// Retention is how long a processed key stays processed, and how long
	// any record lives after its last lease ended. Optional; default
	// inbox.DefaultRetention (7 days); at least a millisecond, at most
	// [MaxDuration].
	Retention time.Duration

	// Lease is the lease granted when TryBegin asks for none. Optional;
	// default inbox.DefaultLease (30 s); at most [MaxDuration].
	Lease time.Duration

	// Timeout bounds each call of the store, from the moment it is made:
	// the time it waits queued behind the round trips in flight (see
	// "Batched round trips" in the package documentation) and its round
	// trips to Redis (one, or two for a TryBegin of a key that exists, and
	// one more when the server had lost the store's scripts), go-redis's
	// own retries included. A caller whose context ends sooner
	// keeps its own deadline. Optional; default [DefaultTimeout] (5 s);
	// negative means no bound of the store's own, so only the caller's
	// context and the client's timeouts apply. The bound reaches the socket
	// only when the client was built with ContextTimeoutEnabled (clients
	// made from a URL are); otherwise the client's ReadTimeout and
	// WriteTimeout apply to each attempt.
	//
	// The calls that are batched (see "Batched round trips") keep the
	// bound as a value, served by one timer of the batcher for all of
	// them; each call that is not (Get, IsProcessed, List, Forget,
	// ForceRelease) gets a timer of its own, unless its context already
	// ends within Timeout.
	Timeout time.Duration

	// AllowEviction accepts a server whose maxmemory-policy can evict the
	// store's keys (any but noeviction: every record has a TTL, so the
	// volatile-* policies evict them too). An evicted processed key is a
	// message that runs again when it is delivered again. Without it, the
	// check at [stores.Open] refuses such a server with an error wrapping
	// [ErrEvictionPolicy]; the URL sets it with allow_eviction=true. [New]
	// sends nothing, so it checks no policy. Optional; default false.
	AllowEviction bool
}

// ErrEvictionPolicy is wrapped by the error of [stores.Open] on a server
// whose maxmemory-policy can evict the store's keys, unless
// [Options.AllowEviction] (allow_eviction=true) accepts it.
var ErrEvictionPolicy = errors.New("redis store: the server's maxmemory-policy can evict the store's keys")

func (o *Options) setDefaults() {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.Retention == 0 {
		o.Retention = inbox.DefaultRetention
	}
	if o.Lease == 0 {
		o.Lease = inbox.DefaultLease
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
}

// Validate reports whether o is usable once defaults are applied (zero
// fields are valid: they take their default). Errors wrap
// [inbox.ErrInvalidArgument] and name the field and its value.
func (o Options) Validate() error {
	if len(o.Prefix) > MaxPrefixLen {
		return fmt.Errorf("%w: redis store: Prefix is %d bytes, longer than the limit of %d", inbox.ErrInvalidArgument, len(o.Prefix), MaxPrefixLen)
	}
	if o.Prefix != "" && !strings.HasSuffix(o.Prefix, PrefixSeparator) {
		return fmt.Errorf("%w: redis store: Prefix %q does not end with %q: without the separator the store's keys run into other namespaces (prefix \"app\" and key \"le:1\" make \"apple:1\"); use %q",
			inbox.ErrInvalidArgument, o.Prefix, PrefixSeparator, o.Prefix+PrefixSeparator)
	}
	if o.Retention != 0 && (o.Retention < time.Millisecond || o.Retention > MaxDuration) {
		return fmt.Errorf("%w: redis store: Retention %s is outside [1ms, %s]", inbox.ErrInvalidArgument, o.Retention, MaxDuration)
	}
	if o.Lease < 0 || o.Lease > MaxDuration {
		return fmt.Errorf("%w: redis store: Lease %s is outside (0, %s]", inbox.ErrInvalidLease, o.Lease, MaxDuration)
	}
	return nil
}

// Store is the Redis [inbox.LeaseStore]. It is safe for concurrent use. The
// portable layer it embeds ([driver.Store]) validates input, bounds and
// batches calls and maps errors; the Redis commands are its driver's.
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
//   - KeepsOrder, Order, ReleaseOrder ([inbox.OrderAdmin]): the order of
//     order keys (the package documentation's "Layout").
//   - Retention() time.Duration: how long a processed key stays processed
//     ([inbox.RetentionReporter], for the middleware's stale check).
//   - BatchStats: how calls were batched; Close.
//
// Complete, Release, Fail and Extend fail with [inbox.ErrLeaseLost] when
// leaseID no longer holds the key; bad input wraps
// [inbox.ErrInvalidArgument]; a backend failure wraps
// [inbox.ErrStoreUnavailable].
type Store struct {
	*driver.Store
	d *rdb
}

var _ inbox.LeaseStore = (*Store)(nil)

// rdb is the store's driver: the Redis commands and scripts.
type rdb struct {
	client redis.UniversalClient
	opts   Options
	owns   bool // Close closes client

	// Script arguments, formatted and boxed once.
	retUS   int64  // the retention in µs
	retMS   int64  // in ms, rounded up: a key's TTL
	retArgs [2]any // ARGV[1] and ARGV[2] of opsScript: retUS and retMS

	// gateTTL is the TTL of an order key's gate from its last change, in
	// ms: the retention plus the default lease, rounded up.
	gateTTL string
}

// gateSep follows the prefix in the Redis key of an order key's gate: an
// inbox key holds no NUL, so no gate is ever an inbox key's record.
const gateSep = "\x00order:"

// gateKey returns the Redis key of orderKey's gate.
func (d *rdb) gateKey(orderKey string) string { return d.opts.Prefix + gateSep + orderKey }

// keepsOrder reports whether the store keeps order over client: the gates'
// scripts read records of keys other than the one they are given, which
// only a server that is no Cluster allows (a Ring spreads keys too).
func keepsOrder(client redis.UniversalClient) bool {
	_, ok := client.(*redis.Client)
	return ok
}

// New returns a store over client, which may be a standalone, Sentinel
// (failover) or Cluster client: every operation touches one key. The store
// does not close client. New checks its options only: it does not contact
// Redis, so a Redis that is down, a wrong password or a missing right make
// calls fail with [inbox.ErrStoreUnavailable] (until it is back, or the
// mistake is fixed). Ping the client before if need be; [stores.Open]
// checks the server (see "Checks at Open" in the package documentation).
func New(client redis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: redis store: client is nil", inbox.ErrInvalidArgument)
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	retUS := micros(opts.Retention)
	retMS := (retUS + 999) / 1000
	d := &rdb{
		client:  client,
		opts:    opts,
		retUS:   retUS,
		retMS:   retMS,
		retArgs: [2]any{strconv.FormatInt(retUS, 10), strconv.FormatInt(retMS, 10)},
		gateTTL: strconv.FormatInt((retUS+micros(opts.Lease)+999)/1000, 10),
	}
	ds, err := driver.New(d, driver.Config{
		Name:        "redis store",
		Lease:       opts.Lease,
		Retention:   opts.Retention,
		MaxLease:    MaxDuration,
		Timeout:     opts.Timeout,
		Batch:       driver.Batch{MaxBatch: maxBatch, MaxQueue: maxQueue, MaxInFlight: maxInFlight},
		BatchExtend: true,
		Order:       keepsOrder(client),
	})
	if err != nil {
		return nil, err
	}
	return &Store{Store: ds, d: d}, nil
}

// Order implements [driver.Orderer]: the gate of orderKey, past its
// processed heads.
func (d *rdb) Order(ctx context.Context, orderKey string) (inbox.OrderGate, error) {
	v, err := orderScript.Run(ctx, d.client, []string{d.gateKey(orderKey)}, d.opts.Prefix, d.gateTTL).Result()
	if err != nil {
		return inbox.OrderGate{}, mapErr(err)
	}
	a, ok := v.([]any)
	if !ok {
		return inbox.OrderGate{}, badReply(v)
	}
	keys := make([]string, len(a))
	for i, e := range a {
		if keys[i], ok = e.(string); !ok || keys[i] == "" {
			return inbox.OrderGate{}, badReply(v)
		}
	}
	if len(keys) == 0 {
		return inbox.OrderGate{}, nil
	}
	g := inbox.OrderGate{Head: keys[0]}
	if len(keys) > 1 {
		g.Waiting = keys[1:]
	}
	return g, nil
}

// ReleaseOrder implements [driver.Orderer].
func (d *rdb) ReleaseOrder(ctx context.Context, orderKey, head string) error {
	v, err := releaseOrderScript.Run(ctx, d.client, []string{d.gateKey(orderKey)}, d.opts.Prefix, d.gateTTL, head).Result()
	if err != nil {
		return mapErr(err)
	}
	switch v := v.(type) {
	case int64:
		switch v {
		case 1:
			return nil
		case 0:
			return fmt.Errorf("%w: no key of the order key waits on %q", inbox.ErrLeaseLost, head)
		}
	case string:
		return fmt.Errorf("%w: the head of the order key is %q, not %q", inbox.ErrLeaseLost, v, head)
	}
	return badReply(v)
}

// Close implements [driver.Driver]. It closes the client only when the
// store made it (opened from a URL).
func (d *rdb) Close() error {
	if !d.owns {
		return nil
	}
	return d.client.Close()
}

// micros converts d to whole microseconds, rounding up.
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

func fromMicros(us int64) time.Time { return time.UnixMicro(us) }

// ttlMS is the physical TTL, in milliseconds, of a fresh record whose
// logical expiry is us microseconds away: rounded up to the next
// millisecond, plus one (see "Record layouts" in doc.go).
func ttlMS(us int64) int64 { return (us+999)/1000 + 1 }

// mapErr keeps go-redis's error of a command in the chain, and turns those
// that must not leak as such into the contract's: a closed client wraps
// inbox.ErrClosed, redis.Nil (the scripts never return nil) wraps
// inbox.ErrStoreUnavailable. The layer maps anything else.
func mapErr(err error) error {
	switch {
	case errors.Is(err, redis.ErrClosed):
		return fmt.Errorf("%w: %w", inbox.ErrClosed, err)
	case errors.Is(err, redis.Nil):
		return fmt.Errorf("%w: unexpected nil reply", inbox.ErrStoreUnavailable)
	}
	return err
}

// badReply is the error for a script reply of the wrong shape.
func badReply(v any) error {
	return fmt.Errorf("%w: unexpected script reply %#v", inbox.ErrStoreUnavailable, v)
}

// holderError maps the negative codes of Complete, Release, Fail and
// Extend.
func holderError(leaseID string, v any) error {
	switch v {
	case int64(-1):
		return fmt.Errorf("%w: the key has no record", inbox.ErrLeaseLost)
	case int64(-2):
		return fmt.Errorf("%w: the key is not held by lease %q", inbox.ErrLeaseLost, leaseID)
	case int64(-3):
		return fmt.Errorf("%w: the key is already processed", inbox.ErrLeaseLost)
	case int64(-4):
		return fmt.Errorf("%w: the key is dead", inbox.ErrLeaseLost)
	}
	return badReply(v)
}

// ints decodes a reply that must be an array of len(dst) integers into dst.
func ints(v any, dst []int64) error {
	a, ok := v.([]any)
	if !ok || len(a) != len(dst) {
		return badReply(v)
	}
	for i, e := range a {
		x, ok := e.(int64)
		if !ok {
			return badReply(v)
		}
		dst[i] = x
	}
	return nil
}

// Extend implements [driver.Driver]: an Apply of one Extend (the layer
// sends Extends through Apply: Config.BatchExtend).
func (d *rdb) Extend(ctx context.Context, key, leaseID string, lease time.Duration) (time.Time, error) {
	var res [1]inbox.Claim
	var errs [1]error
	if err := d.Apply(ctx, []driver.Op{{Kind: driver.Extend, Key: key, LeaseID: leaseID, Lease: lease}}, res[:], errs[:]); err != nil {
		return time.Time{}, err
	}
	return res[0].ExpiresAt, errs[0]
}

// Get implements [driver.Driver].
func (d *rdb) Get(ctx context.Context, key string) (inbox.Record, error) {
	v, err := getScript.Run(ctx, d.client, []string{d.opts.Prefix + key}).Result()
	if err != nil {
		return inbox.Record{}, mapErr(err)
	}
	r, _, err := getReply(v)
	return r, err
}

// getReply decodes the reply of getScript: the record (State NotFound when
// absent) and the Redis clock when it was read.
func getReply(v any) (inbox.Record, time.Time, error) {
	a, ok := v.([]any)
	if !ok || len(a) == 0 {
		return inbox.Record{}, time.Time{}, badReply(v)
	}
	if len(a) == 1 && a[0] == int64(0) {
		return inbox.Record{}, time.Time{}, nil
	}
	if len(a) != 11 {
		return inbox.Record{}, time.Time{}, badReply(v)
	}
	var n [7]int64
	if err := ints(a[:7], n[:]); err != nil {
		return inbox.Record{}, time.Time{}, badReply(v)
	}
	retryAt, ok0 := a[10].(int64)
	owner, ok1 := a[7].(string)
	hash, ok2 := a[8].(string)
	reason, ok3 := a[9].(string)
	now, kind, until, attempts, first, last := n[1], n[2], n[3], n[4], n[5], n[6]
	if n[0] != 1 || !ok0 || !ok1 || !ok2 || !ok3 || until < 0 || attempts < 0 || first < 0 || last < 0 || retryAt < 0 {
		return inbox.Record{}, time.Time{}, badReply(v)
	}
	r := inbox.Record{
		Attempts:    int(attempts),
		FirstSeen:   fromMicros(first),
		LastSeen:    fromMicros(last),
		Owner:       owner,
		PayloadHash: shownHash(hash),
		Reason:      reason,
	}
	switch {
	case kind == 2:
		r.State = inbox.StateProcessed
	case kind == 4:
		r.State = inbox.StateDead
	case kind != 0 && kind != 1:
		return inbox.Record{}, time.Time{}, badReply(v)
	case until > now:
		r.State, r.LeaseUntil = inbox.StateInProgress, fromMicros(until)
	default:
		r.State = inbox.StateAvailable
		if retryAt > now {
			r.RetryAt = fromMicros(retryAt)
		}
	}
	return r, fromMicros(now), nil
}
