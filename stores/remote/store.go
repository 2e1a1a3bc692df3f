package remote

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
	"github.com/watermill-inbox/inbox/stores/remote/internal/wire"
)

var (
	tryBeginEP = endpoint{method: http.MethodPost, path: wire.TryBegin, name: "POST " + wire.TryBegin}
	markEP     = endpoint{method: http.MethodPost, path: wire.MarkProcessed, name: "POST " + wire.MarkProcessed, retry: true}
	releaseEP  = endpoint{method: http.MethodPost, path: wire.Release, name: "POST " + wire.Release, retry: true}
	extendEP   = endpoint{method: http.MethodPost, path: wire.Extend, name: "POST " + wire.Extend, retry: true}
	// fail is retried: a repeat with the same leaseId changes nothing (it
	// is LeaseLost once the first landed); see failAttempt for what a
	// LeaseLost after a lost answer means.
	failEP = endpoint{method: http.MethodPost, path: wire.Fail, name: "POST " + wire.Fail, retry: true}
	// list only reads. Its answer holds up to MaxListLimit records: its
	// bound is set per call.
	listEP = endpoint{method: http.MethodPost, path: wire.List, name: "POST " + wire.List, retry: true}
	// forget and force-release are not retried: a repeat after a lost
	// answer could delete, or end the lease of, a record that a consumer
	// made in between.
	forgetEP = endpoint{method: http.MethodPost, path: wire.Forget, name: "POST " + wire.Forget}
	forceEP  = endpoint{method: http.MethodPost, path: wire.ForceRelease, name: "POST " + wire.ForceRelease}
)

// getEP is GET /v1/inbox/{key}?acceptDead=true; the layer names the key in
// errors. The query asks a server with the fail extension for the status
// Dead; one without it ignores the query.
func getEP(key string) endpoint {
	return endpoint{method: http.MethodGet, path: wire.KeyPrefix + wire.EscapeKey(key), query: wire.AcceptDeadQuery,
		name: "GET /v1/inbox/{key}", retry: true}
}

// maxListItemBytes bounds one item of a list answer: a key, a reason, an
// owner and a payload hash at their limits, JSON-escaped, and the times.
const maxListItemBytes = 8 << 10

// discoverFor reads discovery before a call to ep that needs it.
func (c *client) discoverFor(ctx context.Context, ep endpoint) (*Discovery, error) {
	d, err := c.discovery(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w (needed before %s)", err, ep.name)
	}
	return d, nil
}

// leaseSeconds is d in whole seconds, rounded up; nil (the service's
// default) for zero.
func leaseSeconds(d time.Duration) *int64 {
	if d <= 0 {
		return nil
	}
	n := int64(d / time.Second)
	if d%time.Second != 0 {
		n++
	}
	return &n
}

// post sends a JSON body to ep after reading discovery, and returns the 200
// answer or the error of any other.
func (c *client) post(ctx context.Context, ep endpoint, v any) (result, bool, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return result{}, false, opError(ep, "%w: encoding the request: %v", inbox.ErrInvalidArgument, err)
	}
	res, uncertain, err := c.do(ctx, ep, body)
	if err != nil {
		return result{}, uncertain, err
	}
	if res.code != http.StatusOK {
		return result{}, uncertain, c.statusError(ep, res)
	}
	return res, uncertain, nil
}

// Apply implements [driver.Driver]: one request per op, in order (the layer
// sends one op per call: protocol v1 has no batch endpoint).
func (c *client) Apply(ctx context.Context, ops []driver.Op, res []inbox.Claim, errs []error) error {
	driver.ApplyEach(ctx, c, ops, res, errs)
	return nil
}

// Claim is try-begin. It always sends a lease id (the caller's, or the
// one the layer made), so that it can be retried safely where the service
// honours it, and acceptDead, so that a service with the fail extension
// answers Dead for a dead key (one without it ignores the field).
func (c *client) Claim(ctx context.Context, op driver.Op) (inbox.Claim, error) {
	d, err := c.discoverFor(ctx, tryBeginEP)
	if err != nil {
		return inbox.Claim{}, err
	}
	req := wire.TryBeginRequest{Key: op.Key, Owner: op.Owner, LeaseSeconds: leaseSeconds(op.Lease), LeaseID: op.LeaseID, PayloadHash: op.PayloadHash, AcceptDead: true}
	ep := tryBeginEP
	ep.retry = d.Has(wire.ExtLeaseID)
	res, _, err := c.post(ctx, ep, req)
	if err != nil {
		return inbox.Claim{}, err
	}
	var w wire.TryBeginResponse
	if err := decode(ep, res, &w); err != nil {
		return inbox.Claim{}, err
	}
	st, err := inbox.ParseStatus(w.Status)
	// Behind answers an OrderKey, which protocol v1 does not carry: no
	// service may answer it.
	if err != nil || st == inbox.Behind {
		return inbox.Claim{}, protoError(ep, "unknown status %s (want Acquired, Processed, Busy or Dead)", quote(w.Status, 64))
	}
	if w.Attempts < 0 {
		return inbox.Claim{}, protoError(ep, "negative attempts %d", w.Attempts)
	}
	// attempts is the fail extension's: zero from a service without it.
	claim := inbox.Claim{Status: st, Attempts: w.Attempts, PayloadMismatch: w.PayloadMismatch}
	switch st {
	case inbox.Acquired:
		if err := checkLen(ep, "leaseId", w.LeaseID, inbox.MaxLeaseIDLen); err != nil {
			return inbox.Claim{}, err
		}
		if err := inbox.ValidateLeaseID(w.LeaseID); err != nil {
			return inbox.Claim{}, protoError(ep, "Acquired without a usable leaseId: %v", err)
		}
		if w.ExpiresAt == nil {
			return inbox.Claim{}, protoError(ep, "Acquired without expiresAt")
		}
		if err := checkGranted(ep, d, w.LeaseSeconds); err != nil {
			return inbox.Claim{}, err
		}
		claim.LeaseID, claim.ExpiresAt = w.LeaseID, notAfter(*w.ExpiresAt, MaxLease)
		switch {
		case w.LeaseSeconds > 0:
			claim.Lease = time.Duration(w.LeaseSeconds) * time.Second
		case req.LeaseSeconds != nil:
			claim.Lease = time.Duration(*req.LeaseSeconds) * time.Second
		case d != nil && d.LeaseDefault > 0:
			claim.Lease = d.LeaseDefault
		default:
			claim.Lease = inbox.DefaultLease
		}
		claim.Lease = min(claim.Lease, MaxLease)
	case inbox.Busy:
		if w.ExpiresAt == nil {
			return inbox.Claim{}, protoError(ep, "Busy without expiresAt")
		}
		claim.ExpiresAt = notAfter(*w.ExpiresAt, MaxRetryAfter)
		if w.RetryAfterMs < 0 || w.RetryAfterMs > maxMillis {
			return inbox.Claim{}, protoError(ep, "Busy with retryAfterMs %d, outside [0, %d]", w.RetryAfterMs, int64(maxMillis))
		}
		if w.RetryAfterMs > 0 {
			claim.RetryAfter = time.Duration(w.RetryAfterMs) * time.Millisecond
		} else {
			claim.RetryAfter = max(time.Until(claim.ExpiresAt), 0)
		}
		claim.RetryAfter = min(claim.RetryAfter, MaxRetryAfter)
		// backoff is the fail extension's: false from a service without it,
		// or from one before it was added.
		claim.BackingOff = w.Backoff
	case inbox.Dead:
		if err := checkLen(ep, "reason", w.Reason, inbox.MaxReasonLen); err != nil {
			return inbox.Claim{}, err
		}
		claim.Reason = w.Reason
	}
	return claim, nil
}

// checkLen refuses a field of an answer longer than limit bytes (the limit
// the inbox contract sets on it), naming the field and quoting the start of
// its value.
func checkLen(ep endpoint, field, v string, limit int) error {
	if len(v) <= limit {
		return nil
	}
	return protoError(ep, "%s of %d bytes is over the limit of %d: %s", field, len(v), limit, quote(v, 64))
}

// checkGranted refuses a granted lease (leaseSeconds of try-begin or extend,
// 0 when absent) outside the service's own range (its discovery document),
// or that a time.Duration cannot hold.
func checkGranted(ep endpoint, d *Discovery, sec int64) error {
	switch {
	case sec == 0:
		return nil
	case sec < 0 || sec > maxLeaseSeconds:
		return protoError(ep, "leaseSeconds %d granted, outside [1, %d]", sec, int64(maxLeaseSeconds))
	case d != nil && d.LeaseMax > 0 && (min(time.Duration(sec)*time.Second, MaxLease) < d.LeaseMin || min(time.Duration(sec)*time.Second, MaxLease) > d.LeaseMax):
		return protoError(ep, "leaseSeconds %d granted, outside the service's range [%d, %d] of its discovery document",
			sec, int64(d.LeaseMin/time.Second), int64(d.LeaseMax/time.Second))
	}
	return nil
}

// notAfter is t, or the local clock's now plus limit when t is later: a
// deadline the client believes, whatever the service answered.
func notAfter(t time.Time, limit time.Duration) time.Time {
	if latest := time.Now().Add(limit); t.After(latest) {
		return latest
	}
	return t
}

// holderCall sends a mark-processed, release, extend or fail with a lease
// id and returns the answered status.
func (c *client) holderCall(ctx context.Context, ep endpoint, req any, ok string) (wire.StatusResponse, bool, error) {
	res, uncertain, err := c.post(ctx, ep, req)
	if err != nil {
		return wire.StatusResponse{}, uncertain, err
	}
	var w wire.StatusResponse
	if err := decode(ep, res, &w); err != nil {
		return w, uncertain, err
	}
	if w.Status != ok && w.Status != wire.StatusLeaseLost {
		return w, uncertain, protoError(ep, "unknown status %s (want %s or LeaseLost)", quote(w.Status, 64), ok)
	}
	return w, uncertain, nil
}

func lost(ep endpoint, leaseID string) error {
	return opError(ep, "%w: the key is not held by lease %q", inbox.ErrLeaseLost, leaseID)
}

// Complete is [inbox.LeaseStore.Complete], with mark-processed.
func (c *client) Complete(ctx context.Context, key, leaseID string) error {
	w, _, err := c.holderCall(ctx, markEP, wire.LeaseRequest{Key: key, LeaseID: leaseID}, wire.StatusProcessed)
	if err != nil {
		return err
	}
	if w.Status == wire.StatusLeaseLost {
		return lost(markEP, leaseID)
	}
	return nil
}

// Release is [inbox.LeaseStore.Release]. A LeaseLost heard by a retry after an attempt whose
// answer was lost returns nil: see the package documentation.
func (c *client) Release(ctx context.Context, key, leaseID string) error {
	w, uncertain, err := c.holderCall(ctx, releaseEP, wire.LeaseRequest{Key: key, LeaseID: leaseID}, wire.StatusReleased)
	if err != nil {
		return err
	}
	if w.Status == wire.StatusLeaseLost && !uncertain {
		return lost(releaseEP, leaseID)
	}
	return nil
}

// Fail is [inbox.LeaseStore.Fail], with fail. It fails with [inbox.ErrNotSupported]
// when the service does not list the fail extension (the middleware then
// releases instead).
//
// A fail whose answer was lost, and whose retry then hears LeaseLost, is
// ambiguous: the lost attempt may have landed, or the lease was gone
// before it. For a backoff it returns nil, as release does: the lease is
// gone either way, which is what the caller asked. For dead, it reads the
// key: nil when the key is dead (whoever made it so), else
// [inbox.ErrLeaseLost], so a caller is never told a key is dead when it is
// not.
func (c *client) Fail(ctx context.Context, key, leaseID string, opts inbox.FailOptions) error {
	if err := c.needExt(ctx, failEP, wire.ExtFail); err != nil {
		return err
	}
	req := wire.FailRequest{Key: key, LeaseID: leaseID, Dead: opts.Dead, Reason: opts.Reason}
	if opts.RetryAfter > 0 {
		ms := wire.CeilMillis(opts.RetryAfter) // never shorter
		req.RetryAfterMs = &ms
	}
	ok := wire.StatusReleased
	if opts.Dead {
		ok = wire.StatusDead
	}
	w, uncertain, err := c.holderCall(ctx, failEP, req, ok)
	if err != nil {
		return err
	}
	if w.Status != wire.StatusLeaseLost {
		return nil
	}
	if !uncertain {
		return lost(failEP, leaseID)
	}
	if !opts.Dead {
		return nil
	}
	r, err := c.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("%w (reading the key after a LeaseLost that followed a lost answer)", err)
	}
	if r.State != inbox.StateDead {
		return lost(failEP, leaseID)
	}
	return nil
}

// Mark is MarkProcessed: mark-processed without a lease id, the
// inbox ADR's unleased mark.
func (c *client) Mark(ctx context.Context, key string) error {
	w, _, err := c.holderCall(ctx, markEP, wire.LeaseRequest{Key: key}, wire.StatusProcessed)
	if err != nil {
		return err
	}
	if w.Status != wire.StatusProcessed {
		return protoError(markEP, "status %s for a mark without lease id, want Processed", quote(w.Status, 64))
	}
	return nil
}

// Extend implements [driver.Driver]. It fails with [inbox.ErrNotSupported]
// when the service's discovery document does not list the extend extension.
func (c *client) Extend(ctx context.Context, key, leaseID string, lease time.Duration) (time.Time, error) {
	d, err := c.discoverFor(ctx, extendEP)
	if err != nil {
		return time.Time{}, err
	}
	if !d.Has(wire.ExtExtend) {
		return time.Time{}, opError(extendEP, "%w: the service does not list the %s extension in its discovery document", inbox.ErrNotSupported, wire.ExtExtend)
	}
	w, _, err := c.holderCall(ctx, extendEP, wire.LeaseRequest{Key: key, LeaseID: leaseID, LeaseSeconds: leaseSeconds(lease)}, wire.StatusExtended)
	if err != nil {
		return time.Time{}, err
	}
	if w.Status == wire.StatusLeaseLost {
		return time.Time{}, lost(extendEP, leaseID)
	}
	if w.ExpiresAt == nil {
		return time.Time{}, protoError(extendEP, "Extended without expiresAt")
	}
	if err := checkGranted(extendEP, d, w.LeaseSeconds); err != nil {
		return time.Time{}, err
	}
	return notAfter(*w.ExpiresAt, MaxLease), nil
}

// Get implements [driver.Driver] with GET /v1/inbox/{key}; the layer's
// IsProcessed is a Get too.
func (c *client) Get(ctx context.Context, key string) (inbox.Record, error) {
	ep := getEP(key)
	d, err := c.discoverFor(ctx, ep)
	if err != nil {
		return inbox.Record{}, err
	}
	res, _, err := c.do(ctx, ep, nil)
	if err != nil {
		return inbox.Record{}, err
	}
	switch {
	case res.code == http.StatusNotFound && d != nil:
		return inbox.Record{}, nil // a server that published discovery answers 404 for an unknown key
	case res.code == http.StatusNotFound:
		return inbox.Record{}, opError(ep, "%w: %w: HTTP 404 from a service without a discovery document: a wrong base URL, not read as NotFound",
			inbox.ErrStoreUnavailable, ErrEndpointNotFound)
	case res.code != http.StatusOK:
		return inbox.Record{}, c.statusError(ep, res)
	}
	var w wire.RecordResponse
	if err := decode(ep, res, &w); err != nil {
		return inbox.Record{}, err
	}
	return parseRecord(ep, w)
}

// parseRecord reads a GET answer, or a list item.
func parseRecord(ep endpoint, w wire.RecordResponse) (inbox.Record, error) {
	state, err := inbox.ParseState(w.Status)
	if err != nil {
		return inbox.Record{}, protoError(ep, "unknown status %s (want NotFound, Available, InProgress, Processed or Dead)", quote(w.Status, 64))
	}
	if state == inbox.StateNotFound {
		return inbox.Record{}, nil
	}
	if w.FirstSeen == nil || w.LastSeen == nil {
		return inbox.Record{}, protoError(ep, "%s without firstSeen or lastSeen", w.Status)
	}
	if w.Attempts < 0 {
		return inbox.Record{}, protoError(ep, "negative attempts %d", w.Attempts)
	}
	for _, f := range []struct {
		name, v string
		limit   int
	}{{"owner", w.Owner, inbox.MaxOwnerLen}, {"payloadHash", w.PayloadHash, inbox.MaxPayloadHashLen}, {"reason", w.Reason, inbox.MaxReasonLen}} {
		if err := checkLen(ep, f.name, f.v, f.limit); err != nil {
			return inbox.Record{}, err
		}
	}
	r := inbox.Record{State: state, Attempts: w.Attempts, FirstSeen: *w.FirstSeen, LastSeen: *w.LastSeen,
		Owner: w.Owner, PayloadHash: w.PayloadHash, Reason: w.Reason}
	if w.LeaseUntil != nil && state == inbox.StateInProgress {
		r.LeaseUntil = *w.LeaseUntil
	}
	if w.RetryAt != nil && state == inbox.StateAvailable {
		r.RetryAt = *w.RetryAt
	}
	return r, nil
}

// needExt reads discovery before a call to ep of the extension ext, and
// fails with inbox.ErrNotSupported when the service does not list it.
func (c *client) needExt(ctx context.Context, ep endpoint, ext string) error {
	d, err := c.discoverFor(ctx, ep)
	if err != nil {
		return err
	}
	if !d.Has(ext) {
		return opError(ep, "%w: the service does not list the %s extension in its discovery document", inbox.ErrNotSupported, ext)
	}
	return nil
}

// List implements [driver.Driver] with list (admin extension).
func (c *client) List(ctx context.Context, opts inbox.ListOptions) (inbox.ListPage, error) {
	ep := listEP
	if err := c.needExt(ctx, ep, wire.ExtAdmin); err != nil {
		return inbox.ListPage{}, err
	}
	limit := int64(opts.Limit)
	req := wire.ListRequest{Prefix: opts.Prefix, Cursor: opts.Cursor, Limit: &limit}
	if opts.State != inbox.StateNotFound {
		req.State = opts.State.String()
	}
	if opts.OlderThan > 0 {
		ms := wire.CeilMillis(opts.OlderThan) // never younger than asked
		req.OlderThanMs = &ms
	}
	ep.maxBody = c.opts.MaxResponseBytes + limit*maxListItemBytes
	res, _, err := c.post(ctx, ep, req)
	if err != nil {
		return inbox.ListPage{}, err
	}
	var w wire.ListResponse
	if err := decode(ep, res, &w); err != nil {
		return inbox.ListPage{}, err
	}
	if w.Items == nil {
		return inbox.ListPage{}, protoError(ep, "no items")
	}
	if len(w.Items) > opts.Limit {
		return inbox.ListPage{}, protoError(ep, "%d items, over the limit of %d asked", len(w.Items), opts.Limit)
	}
	p := inbox.ListPage{Next: w.Next, Items: make([]inbox.ListItem, len(w.Items))}
	for i, it := range w.Items {
		if err := checkLen(ep, fmt.Sprintf("item %d: key", i), it.Key, inbox.MaxKeyLen); err != nil {
			return inbox.ListPage{}, err
		}
		if err := inbox.ValidateKey(it.Key); err != nil {
			return inbox.ListPage{}, protoError(ep, "item %d: %v", i, err)
		}
		r, err := parseRecord(ep, it.RecordResponse)
		if err != nil {
			return inbox.ListPage{}, err
		}
		if r.State == inbox.StateNotFound {
			return inbox.ListPage{}, protoError(ep, "item %d (%s) is NotFound", i, quote(it.Key, 64))
		}
		p.Items[i] = inbox.ListItem{Key: it.Key, Record: r}
	}
	return p, nil
}

// Forget implements [driver.Driver] with forget (admin extension).
func (c *client) Forget(ctx context.Context, key string) error {
	return c.keyCall(ctx, forgetEP, key, wire.StatusForgotten)
}

// ForceRelease implements [driver.Driver] with force-release (admin
// extension).
func (c *client) ForceRelease(ctx context.Context, key string) error {
	return c.keyCall(ctx, forceEP, key, wire.StatusReleased)
}

func (c *client) keyCall(ctx context.Context, ep endpoint, key, ok string) error {
	if err := c.needExt(ctx, ep, wire.ExtAdmin); err != nil {
		return err
	}
	res, _, err := c.post(ctx, ep, wire.KeyRequest{Key: key})
	if err != nil {
		return err
	}
	var w wire.StatusResponse
	if err := decode(ep, res, &w); err != nil {
		return err
	}
	if w.Status != ok {
		return protoError(ep, "unknown status %s (want %s)", quote(w.Status, 64), ok)
	}
	return nil
}
