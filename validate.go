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
	case validText(key):
		return nil
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: key %q is not valid UTF-8", ErrInvalidKey, key)
	case strings.IndexByte(key, 0) >= 0:
		return fmt.Errorf("%w: key %q holds a NUL byte", ErrInvalidKey, key)
	}
	return nil
}

// validText reports whether s is valid UTF-8 without a NUL byte. Keys, lease
// ids and owners are nearly always printable ASCII, which it checks eight
// bytes at a time; anything else takes utf8.ValidString.
func validText(s string) bool {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	for t := s; ; t = t[8:] {
		if len(t) < 8 {
			for i := 0; i < len(t); i++ {
				if c := t[i]; c == 0 || c >= 0x80 {
					return validTextSlow(s)
				}
			}
			return true
		}
		w := uint64(t[0]) | uint64(t[1])<<8 | uint64(t[2])<<16 | uint64(t[3])<<24 |
			uint64(t[4])<<32 | uint64(t[5])<<40 | uint64(t[6])<<48 | uint64(t[7])<<56
		// A byte >= 0x80, or a zero byte ((w-lo) &^ w sets its high bit).
		if (w|(w-lo)&^w)&hi != 0 {
			return validTextSlow(s)
		}
	}
}

func validTextSlow(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// ValidateLeaseID reports whether id is a usable lease id: 1 to
// [MaxLeaseIDLen] bytes. The error wraps [ErrInvalidLeaseID].
func ValidateLeaseID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: lease id is empty", ErrInvalidLeaseID)
	case len(id) > MaxLeaseIDLen:
		return fmt.Errorf("%w: lease id is %d bytes, longer than the limit of %d", ErrInvalidLeaseID, len(id), MaxLeaseIDLen)
	case !validText(id):
		return fmt.Errorf("%w: lease id %q is not valid UTF-8 without NUL", ErrInvalidLeaseID, id)
	}
	return nil
}

// ValidateHolder reports whether key and leaseID are usable arguments of
// Complete, Release and Extend: [ValidateKey] of key, then [ValidateLeaseID]
// of leaseID. Stores call it before any I/O.
func ValidateHolder(key, leaseID string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	return ValidateLeaseID(leaseID)
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
	if len(o.Owner) > MaxOwnerLen || !validText(o.Owner) {
		return fmt.Errorf("%w: owner must be valid UTF-8 without NUL of at most %d bytes, got %d bytes", ErrInvalidArgument, MaxOwnerLen, len(o.Owner))
	}
	if len(o.PayloadHash) > MaxPayloadHashLen || !validText(o.PayloadHash) {
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
