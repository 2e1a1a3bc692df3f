package server

import (
	"container/heap"
	"fmt"
	"hash/maphash"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

// tenant is what the limits count per consumer token: the tokens limited
// to the same key prefixes (the old and the new token of a rotation) are
// one tenant, and so are the tokens without prefixes. The operators'
// tokens are one more, counted in the store's capacity only.
type tenant struct {
	admin bool

	mu     sync.Mutex // guards tokens and last: the request rate
	tokens float64
	last   time.Time

	charges chargeHeap // the tenant's live records, under records.mu
}

// tenantKey names the tenant of a grant: its prefixes, sorted.
func tenantKey(prefixes []string) string {
	p := slices.Clone(prefixes)
	slices.Sort(p)
	return strings.Join(slices.Compact(p), "\x00")
}

// allow takes one request from t's rate, refilled at perSecond up to a
// second's worth; false and the wait before the next one when it is spent.
func (t *tenant) allow(perSecond float64, now time.Time) (bool, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	burst := math.Max(1, math.Ceil(perSecond))
	if t.last.IsZero() {
		t.tokens = burst
	} else {
		t.tokens = math.Min(burst, t.tokens+now.Sub(t.last).Seconds()*perSecond)
	}
	t.last = now
	if t.tokens < 1 {
		return false, time.Duration((1 - t.tokens) / perSecond * float64(time.Second))
	}
	t.tokens--
	return true, 0
}

// records counts the consumers' live records in the store, per tenant, to
// refuse (429 quota_exceeded) a call that would create one more than a
// tenant's share or than the store's capacity: on a store that evicts when
// full (the memory store), no tenant's records can then push out
// another's. A record is counted from the call that may create it
// (try-begin, mark-processed without lease) until ttl after the last write
// to it through the server plus the longest time the store keeps a record
// after a write (the lease or the backoff it starts, and the retention),
// which outlasts the record in the store; the count is of key hashes, a
// hundred bytes a record.
type records struct {
	leaseMax  time.Duration // Config.LeaseMax: the longest lease a write starts
	retention time.Duration // Config.Retention
	capacity  int           // Config.StoreCapacity; 0: the store does not evict
	fixed     int           // Config.MaxRecordsPerToken; 0: derived from capacity, or none
	perTenant int           // the share in force (0: none)
	total     int           // the capacity in force (0: none)

	seed    maphash.Seed
	mu      sync.Mutex
	keys    map[uint64]*charge
	tenants map[*tenant]bool // those with counted records
}

// charge is one counted record.
type charge struct {
	h         uint64 // the key's hash
	owner     *tenant
	until     time.Time
	i         int  // index in owner.charges
	pending   int  // calls in flight that may create the record
	confirmed bool // a call succeeded: the record exists
}

type chargeHeap []*charge

func (h chargeHeap) Len() int           { return len(h) }
func (h chargeHeap) Less(i, j int) bool { return h[i].until.Before(h[j].until) }
func (h chargeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].i = i; h[j].i = j }
func (h *chargeHeap) Push(x any)        { c := x.(*charge); c.i = len(*h); *h = append(*h, c) }
func (h *chargeHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	c.i = -1
	return c
}

// newRecords returns the counter of cfg's limits, nil when it has none.
// A negative MaxRecordsPerToken is no bound of its own.
func newRecords(cfg Config) *records {
	fixed := max(cfg.MaxRecordsPerToken, 0)
	if fixed == 0 && cfg.StoreCapacity == 0 {
		return nil
	}
	return &records{
		leaseMax: cfg.LeaseMax, retention: cfg.Retention,
		capacity: cfg.StoreCapacity, fixed: fixed,
		seed: maphash.MakeSeed(), keys: map[uint64]*charge{}, tenants: map[*tenant]bool{},
	}
}

// setTenants sets the limits in force for n consumers' tenants: the
// configured share, else, on a store that evicts, its capacity shared
// equally, and the capacity itself; with one tenant, none of the two (it
// can only evict its own records, as the store does without the server).
func (r *records) setTenants(n int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.perTenant, r.total = r.fixed, 0
	if r.capacity > 0 && n >= 2 {
		r.total = r.capacity
		if r.fixed == 0 {
			r.perTenant = max(r.capacity/n, 1)
		}
	}
}

// admit counts key for t before a call that may create its record, and
// returns the function to call with the call's outcome; or, when t may not
// create one more record, the reason and the wait until one of the
// records in the way expires.
func (r *records) admit(t *tenant, key string) (done func(ok bool), wait time.Duration, reason string) {
	if r == nil || t == nil || (t.admin && r.capacity == 0) {
		// The operators' records count only in a store's capacity.
		return func(bool) {}, 0, ""
	}
	h := maphash.String(r.seed, key)
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	c := r.keys[h]
	if c != nil && !c.until.After(now) && c.pending == 0 {
		r.remove(c)
		c = nil
	}
	if c == nil {
		r.expire(t, now)
		if !t.admin && r.perTenant > 0 && t.charges.Len() >= r.perTenant {
			return nil, t.charges[0].until.Sub(now), fmt.Sprintf("this bearer token's keys have their share of live records in the store (%d)", r.perTenant)
		}
		if r.total > 0 && len(r.keys) >= r.total {
			if w, ok := r.expireAll(now); !ok {
				return nil, w, fmt.Sprintf("the store holds as many live records as it may (%d) without evicting another token's", r.total)
			}
		}
		if r.capacity > 0 && r.total == 0 {
			// Counted but not bounded (one tenant): the store evicts
			// past its capacity, and so does the count, oldest first.
			for len(r.keys) >= r.capacity && r.dropOldest() {
			}
		}
		c = &charge{h: h, owner: t, until: now.Add(r.leaseMax + r.retention)}
		heap.Push(&t.charges, c)
		r.keys[h] = c
		r.tenants[t] = true
	}
	c.pending++
	return func(ok bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		c.pending--
		if r.keys[h] != c {
			return
		}
		switch {
		case ok:
			c.confirmed = true
			r.arm(c, r.leaseMax)
		case !c.confirmed && c.pending == 0:
			r.remove(c)
		}
	}, 0, ""
}

// touch re-arms the count of key after a write to its record that starts
// a lease or a backoff of at most d.
func (r *records) touch(key string, d time.Duration) {
	if r == nil {
		return
	}
	h := maphash.String(r.seed, key)
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.keys[h]; c != nil {
		r.arm(c, d)
	}
}

// drop stops counting key, whose record was deleted (forget).
func (r *records) drop(key string) {
	if r == nil {
		return
	}
	h := maphash.String(r.seed, key)
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.keys[h]; c != nil && c.pending == 0 {
		r.remove(c)
	}
}

// arm counts c at least until d and the retention from now.
func (r *records) arm(c *charge, d time.Duration) {
	if until := time.Now().Add(d + r.retention); until.After(c.until) {
		c.until = until
		heap.Fix(&c.owner.charges, c.i)
	}
}

func (r *records) remove(c *charge) {
	heap.Remove(&c.owner.charges, c.i)
	delete(r.keys, c.h)
}

// expire stops counting t's records that have expired.
func (r *records) expire(t *tenant, now time.Time) {
	for t.charges.Len() > 0 && !t.charges[0].until.After(now) && t.charges[0].pending == 0 {
		delete(r.keys, heap.Pop(&t.charges).(*charge).h)
	}
	if t.charges.Len() == 0 {
		delete(r.tenants, t)
	}
}

// dropOldest stops counting the record of the earliest end among those
// not in a call; false when there is none.
func (r *records) dropOldest() bool {
	var oldest *charge
	for t := range r.tenants {
		if t.charges.Len() > 0 && t.charges[0].pending == 0 && (oldest == nil || t.charges[0].until.Before(oldest.until)) {
			oldest = t.charges[0]
		}
	}
	if oldest == nil {
		return false
	}
	r.remove(oldest)
	return true
}

// expireAll expires every tenant's records; when the store is still full,
// it returns the wait until the first record expires.
func (r *records) expireAll(now time.Time) (time.Duration, bool) {
	wait := time.Duration(math.MaxInt64)
	for t := range r.tenants {
		r.expire(t, now)
		if t.charges.Len() > 0 {
			wait = min(wait, t.charges[0].until.Sub(now))
		}
	}
	return wait, len(r.keys) < r.total
}

// authFailures limits the failed authentications of each client address
// (an IPv4 address, an IPv6 /64): past perMinute, refilled at perMinute a
// minute, the address's requests that need a token are refused (429
// too_many_auth_failures) without checking it, so guessing is slow. It
// keeps at most maxAuthAddrs addresses (see evict).
type authFailures struct {
	perMinute float64
	mu        sync.RWMutex
	addrs     map[string]*authEntry
}

// maxAuthAddrs bounds the addresses authFailures keeps.
const maxAuthAddrs = 4096

type authEntry struct {
	tokens       float64
	last         time.Time
	blockedUntil time.Time
}

func newAuthFailures(perMinute int) *authFailures {
	if perMinute <= 0 {
		return nil
	}
	return &authFailures{perMinute: float64(perMinute), addrs: map[string]*authEntry{}}
}

// clientKey is what the limit counts a request's remote address as.
func clientKey(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	if ip = ip.Unmap(); ip.Is6() {
		ip = netip.PrefixFrom(ip, 64).Masked().Addr()
	}
	return ip.String()
}

// blocked reports whether the address is past its budget, and for how long.
func (a *authFailures) blocked(remoteAddr string, now time.Time) (time.Duration, bool) {
	if a == nil {
		return 0, false
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if e := a.addrs[clientKey(remoteAddr)]; e != nil && now.Before(e.blockedUntil) {
		return e.blockedUntil.Sub(now), true
	}
	return 0, false
}

// fail counts a failed authentication of the address.
func (a *authFailures) fail(remoteAddr string, now time.Time) {
	if a == nil {
		return
	}
	key := clientKey(remoteAddr)
	perSecond := a.perMinute / 60
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.addrs[key]
	if e == nil {
		if len(a.addrs) >= maxAuthAddrs {
			a.evict(now, perSecond)
		}
		e = &authEntry{tokens: a.perMinute}
		a.addrs[key] = e
	} else {
		e.tokens = math.Min(a.perMinute, e.tokens+now.Sub(e.last).Seconds()*perSecond)
	}
	e.last = now
	e.tokens--
	if e.tokens < 1 {
		e.blockedUntil = now.Add(time.Duration((1 - e.tokens) / perSecond * float64(time.Second)))
	}
}

// evict makes room for new addresses, an eighth of maxAuthAddrs at once so
// that a stream of new addresses costs little: it drops the addresses
// whose budget is full again, then, as needed, those not blocked, then any.
func (a *authFailures) evict(now time.Time, perSecond float64) {
	target := maxAuthAddrs - maxAuthAddrs/8
	for k, e := range a.addrs {
		if e.tokens+now.Sub(e.last).Seconds()*perSecond >= a.perMinute {
			delete(a.addrs, k)
		}
	}
	for _, blockedToo := range []bool{false, true} {
		for k, e := range a.addrs {
			if len(a.addrs) <= target {
				return
			}
			if blockedToo || !now.Before(e.blockedUntil) {
				delete(a.addrs, k)
			}
		}
	}
}
