package inbox

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// ValidateKey reports whether key is a valid inbox key: 1 to [MaxKeyLen] bytes
// of valid UTF-8 without a NUL byte. The error wraps [ErrInvalidKey] and says
// what is wrong. Stores call it before touching their backend.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: key is empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: key is %d bytes, longer than the limit of %d (key starts %q)", ErrInvalidKey, len(key), MaxKeyLen, key[:32])
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: key %q is not valid UTF-8", ErrInvalidKey, key)
	case strings.IndexByte(key, 0) >= 0:
		return fmt.Errorf("%w: key %q holds a NUL byte", ErrInvalidKey, key)
	}
	return nil
}

// ValidateLeaseID reports whether id is a usable lease id: 1 to
// [MaxLeaseIDLen] bytes. The error wraps [ErrInvalidLeaseID].
func ValidateLeaseID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: lease id is empty", ErrInvalidLeaseID)
	case len(id) > MaxLeaseIDLen:
		return fmt.Errorf("%w: lease id is %d bytes, longer than the limit of %d", ErrInvalidLeaseID, len(id), MaxLeaseIDLen)
	case !utf8.ValidString(id) || strings.IndexByte(id, 0) >= 0:
		return fmt.Errorf("%w: lease id %q is not valid UTF-8 without NUL", ErrInvalidLeaseID, id)
	}
	return nil
}

// ValidateLease reports whether d is a usable lease length for Extend: more
// than zero. The error wraps [ErrInvalidLease].
func ValidateLease(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: lease %s must be positive", ErrInvalidLease, d)
	}
	return nil
}

// Validate checks o for [LeaseStore.TryBegin]: Lease zero (the store's default)
// or positive; LeaseID empty or valid; Owner and PayloadHash within their
// limits. Errors wrap [ErrInvalidArgument].
func (o BeginOptions) Validate() error {
	if o.Lease < 0 {
		return fmt.Errorf("%w: lease %s is negative (zero means the store's default)", ErrInvalidLease, o.Lease)
	}
	if o.LeaseID != "" {
		if err := ValidateLeaseID(o.LeaseID); err != nil {
			return err
		}
	}
	if len(o.Owner) > MaxOwnerLen || !utf8.ValidString(o.Owner) || strings.IndexByte(o.Owner, 0) >= 0 {
		return fmt.Errorf("%w: owner must be valid UTF-8 without NUL of at most %d bytes, got %d bytes", ErrInvalidArgument, MaxOwnerLen, len(o.Owner))
	}
	if len(o.PayloadHash) > MaxPayloadHashLen || !utf8.ValidString(o.PayloadHash) || strings.IndexByte(o.PayloadHash, 0) >= 0 {
		return fmt.Errorf("%w: payload hash must be valid UTF-8 without NUL of at most %d bytes, got %d bytes", ErrInvalidArgument, MaxPayloadHashLen, len(o.PayloadHash))
	}
	return nil
}

// NewLeaseID returns a random lease id: 32 hex digits (128 bits from
// crypto/rand). Stores use it when [BeginOptions.LeaseID] is empty; clients
// use it to make TryBegin retryable.
func NewLeaseID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+); it panics instead.
	return hex.EncodeToString(b[:])
}
