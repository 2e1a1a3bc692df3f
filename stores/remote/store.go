package remote

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/remote/internal/wire"
)

var (
	tryBeginEP = endpoint{method: http.MethodPost, path: wire.TryBegin, name: "POST " + wire.TryBegin}
	markEP     = endpoint{method: http.MethodPost, path: wire.MarkProcessed, name: "POST " + wire.MarkProcessed, retry: true}
	releaseEP  = endpoint{method: http.MethodPost, path: wire.Release, name: "POST " + wire.Release, retry: true}
	extendEP   = endpoint{method: http.MethodPost, path: wire.Extend, name: "POST " + wire.Extend, retry: true}
)

func getEP(key string) endpoint {
	return endpoint{method: http.MethodGet, path: wire.KeyPrefix + wire.EscapeKey(key), name: fmt.Sprintf("GET /v1/inbox/{key} (key %q)", key), retry: true}
}

// discover reads discovery before a call to ep that needs it.
func (s *Store) discover(ctx context.Context, ep endpoint) (*Discovery, error) {
	d, err := s.Discover(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w (needed before %s)", err, ep.name)
	}
	return d, nil
}

// leaseSeconds is d in whole seconds, rounded up.
func leaseSeconds(d time.Duration) *int64 {
	if d <= 0 {
		return nil
	}
	n := int64((d + time.Second - 1) / time.Second)
	return &n
}

// post sends a JSON body to ep after reading discovery, and returns the 200
// answer or the error of any other.
func (s *Store) post(ctx context.Context, ep endpoint, v any) (result, bool, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return result{}, false, opError(ep, "%w: encoding the request: %v", inbox.ErrInvalidArgument, err)
	}
	res, uncertain, err := s.do(ctx, ep, body)
	if err != nil {
		return result{}, uncertain, err
	}
	if res.code != http.StatusOK {
		return result{}, uncertain, s.statusError(ep, res)
	}
	return res, uncertain, nil
}

// TryBegin implements [inbox.LeaseStore]. It always sends a lease id (the
// caller's or a new one), so that it can be retried safely.
func (s *Store) TryBegin(ctx context.Context, key string, opts inbox.BeginOptions) (inbox.Claim, error) {
	if err := inbox.ValidateKey(key); err != nil {
		return inbox.Claim{}, err
	}
	if err := opts.Validate(); err != nil {
		return inbox.Claim{}, err
	}
	if err := ctx.Err(); err != nil {
		return inbox.Claim{}, opError(tryBeginEP, "%w", err)
	}
	d, err := s.discover(ctx, tryBeginEP)
	if err != nil {
		return inbox.Claim{}, err
	}
	lease := opts.Lease
	if lease == 0 {
		lease = s.opts.Lease
	}
	req := wire.TryBeginRequest{Key: key, Owner: opts.Owner, LeaseSeconds: leaseSeconds(lease), LeaseID: opts.LeaseID, PayloadHash: opts.PayloadHash}
	if req.LeaseID == "" {
		req.LeaseID = inbox.NewLeaseID()
	}
	ep := tryBeginEP
	ep.retry = d.Has(wire.ExtLeaseID)
	res, _, err := s.post(ctx, ep, req)
	if err != nil {
		return inbox.Claim{}, err
	}
	var w wire.TryBeginResponse
	if err := decode(ep, res, &w); err != nil {
		return inbox.Claim{}, err
	}
	st, err := inbox.ParseStatus(w.Status)
	if err != nil {
		return inbox.Claim{}, protoError(ep, "unknown status %q (want Acquired, Processed or Busy)", w.Status)
	}
	c := inbox.Claim{Status: st, PayloadMismatch: w.PayloadMismatch}
	switch st {
	case inbox.Acquired:
		if err := inbox.ValidateLeaseID(w.LeaseID); err != nil {
			return inbox.Claim{}, protoError(ep, "Acquired without a usable leaseId: %v", err)
		}
		if w.ExpiresAt == nil {
			return inbox.Claim{}, protoError(ep, "Acquired without expiresAt")
		}
		c.LeaseID, c.ExpiresAt = w.LeaseID, *w.ExpiresAt
		switch {
		case w.LeaseSeconds > 0:
			c.Lease = time.Duration(w.LeaseSeconds) * time.Second
		case req.LeaseSeconds != nil:
			c.Lease = time.Duration(*req.LeaseSeconds) * time.Second
		case d != nil && d.LeaseDefault > 0:
			c.Lease = d.LeaseDefault
		default:
			c.Lease = inbox.DefaultLease
		}
	case inbox.Busy:
		if w.ExpiresAt == nil {
			return inbox.Claim{}, protoError(ep, "Busy without expiresAt")
		}
		c.ExpiresAt = *w.ExpiresAt
		if w.RetryAfterMs > 0 {
			c.RetryAfter = time.Duration(w.RetryAfterMs) * time.Millisecond
		} else {
			c.RetryAfter = max(time.Until(c.ExpiresAt), 0)
		}
	}
	return c, nil
}

// holderCall sends a mark-processed, release or extend with a lease id and
// returns the answered status.
func (s *Store) holderCall(ctx context.Context, ep endpoint, req wire.LeaseRequest, ok string) (wire.StatusResponse, bool, error) {
	res, uncertain, err := s.post(ctx, ep, req)
	if err != nil {
		return wire.StatusResponse{}, uncertain, err
	}
	var w wire.StatusResponse
	if err := decode(ep, res, &w); err != nil {
		return w, uncertain, err
	}
	if w.Status != ok && w.Status != wire.StatusLeaseLost {
		return w, uncertain, protoError(ep, "unknown status %q (want %s or LeaseLost)", w.Status, ok)
	}
	return w, uncertain, nil
}

func lost(ep endpoint, key, leaseID string) error {
	return opError(ep, "%w: key %q is not held by lease %q", inbox.ErrLeaseLost, key, leaseID)
}

// Complete implements [inbox.LeaseStore] with mark-processed.
func (s *Store) Complete(ctx context.Context, key, leaseID string) error {
	if err := inbox.ValidateHolder(key, leaseID); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return opError(markEP, "%w", err)
	}
	w, _, err := s.holderCall(ctx, markEP, wire.LeaseRequest{Key: key, LeaseID: leaseID}, wire.StatusProcessed)
	if err != nil {
		return err
	}
	if w.Status == wire.StatusLeaseLost {
		return lost(markEP, key, leaseID)
	}
	return nil
}

// Release implements [inbox.LeaseStore]. A LeaseLost heard by a retry after
// an attempt whose answer was lost returns nil: see the package
// documentation.
func (s *Store) Release(ctx context.Context, key, leaseID string) error {
	if err := inbox.ValidateHolder(key, leaseID); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return opError(releaseEP, "%w", err)
	}
	w, uncertain, err := s.holderCall(ctx, releaseEP, wire.LeaseRequest{Key: key, LeaseID: leaseID}, wire.StatusReleased)
	if err != nil {
		return err
	}
	if w.Status == wire.StatusLeaseLost && !uncertain {
		return lost(releaseEP, key, leaseID)
	}
	return nil
}

// Extend implements [inbox.LeaseStore]. It fails with [inbox.ErrNotSupported]
// when the service's discovery document does not list the extend extension.
func (s *Store) Extend(ctx context.Context, key, leaseID string, lease time.Duration) (time.Time, error) {
	if err := inbox.ValidateHolder(key, leaseID); err != nil {
		return time.Time{}, err
	}
	if err := inbox.ValidateLease(lease); err != nil {
		return time.Time{}, err
	}
	if err := ctx.Err(); err != nil {
		return time.Time{}, opError(extendEP, "%w", err)
	}
	d, err := s.discover(ctx, extendEP)
	if err != nil {
		return time.Time{}, err
	}
	if !d.Has(wire.ExtExtend) {
		return time.Time{}, opError(extendEP, "%w: the service does not list the extend extension in its discovery document", inbox.ErrNotSupported)
	}
	w, _, err := s.holderCall(ctx, extendEP, wire.LeaseRequest{Key: key, LeaseID: leaseID, LeaseSeconds: leaseSeconds(lease)}, wire.StatusExtended)
	if err != nil {
		return time.Time{}, err
	}
	if w.Status == wire.StatusLeaseLost {
		return time.Time{}, lost(extendEP, key, leaseID)
	}
	if w.ExpiresAt == nil {
		return time.Time{}, protoError(extendEP, "Extended without expiresAt")
	}
	return *w.ExpiresAt, nil
}

// Get implements [inbox.LeaseStore] with GET /v1/inbox/{key}.
func (s *Store) Get(ctx context.Context, key string) (inbox.Record, error) {
	if err := inbox.ValidateKey(key); err != nil {
		return inbox.Record{}, err
	}
	ep := getEP(key)
	if err := ctx.Err(); err != nil {
		return inbox.Record{}, opError(ep, "%w", err)
	}
	d, err := s.discover(ctx, ep)
	if err != nil {
		return inbox.Record{}, err
	}
	res, _, err := s.do(ctx, ep, nil)
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
		return inbox.Record{}, s.statusError(ep, res)
	}
	var w wire.RecordResponse
	if err := decode(ep, res, &w); err != nil {
		return inbox.Record{}, err
	}
	state, err := inbox.ParseState(w.Status)
	if err != nil {
		return inbox.Record{}, protoError(ep, "unknown status %q (want NotFound, Available, InProgress or Processed)", w.Status)
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
	r := inbox.Record{State: state, Attempts: w.Attempts, FirstSeen: *w.FirstSeen, LastSeen: *w.LastSeen, Owner: w.Owner, PayloadHash: w.PayloadHash}
	if w.LeaseUntil != nil && state == inbox.StateInProgress {
		r.LeaseUntil = *w.LeaseUntil
	}
	return r, nil
}

// IsProcessed implements [inbox.Store] with GET /v1/inbox/{key}.
func (s *Store) IsProcessed(ctx context.Context, key string) (bool, error) {
	r, err := s.Get(ctx, key)
	return r.State == inbox.StateProcessed, err
}

// MarkProcessed implements [inbox.Store] with mark-processed without a lease
// id: the inbox ADR's unleased mark.
func (s *Store) MarkProcessed(ctx context.Context, key string) error {
	if err := inbox.ValidateKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return opError(markEP, "%w", err)
	}
	w, _, err := s.holderCall(ctx, markEP, wire.LeaseRequest{Key: key}, wire.StatusProcessed)
	if err != nil {
		return err
	}
	if w.Status != wire.StatusProcessed {
		return protoError(markEP, "status %q for a mark without lease id, want Processed", w.Status)
	}
	return nil
}
