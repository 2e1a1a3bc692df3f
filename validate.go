package inbox

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
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

// Validate checks o for [LeaseStore.Fail]: RetryAfter not negative, Reason
// within [MaxReasonLen] bytes of valid UTF-8 without NUL. Errors wrap
// [ErrInvalidArgument].
func (o FailOptions) Validate() error {
	if o.RetryAfter < 0 {
		return fmt.Errorf("%w: retry after %s is negative", ErrInvalidArgument, o.RetryAfter)
	}
	if len(o.Reason) > MaxReasonLen || !validText(o.Reason) {
		return fmt.Errorf("%w: reason must be valid UTF-8 without NUL of at most %d bytes, got %d bytes (see TruncateReason)", ErrInvalidArgument, MaxReasonLen, len(o.Reason))
	}
	return nil
}

// TruncateReason makes s a valid [FailOptions.Reason] of at most n bytes
// (and at most MaxReasonLen): invalid UTF-8 and NUL bytes become U+FFFD,
// and a longer text is cut at a rune boundary and ends with "...".
func TruncateReason(s string, n int) string {
	n = min(n, MaxReasonLen)
	if !validText(s) {
		s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", "\uFFFD"), "\uFFFD")
	}
	if len(s) <= n {
		return s
	}
	cut := max(n-3, 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."[:min(3, n)]
}

// Validate checks o for [Admin.List]: a known State, a Limit within
// [0, MaxListLimit], a Prefix and Cursor of valid UTF-8 without NUL, no
// negative OlderThan. Errors wrap [ErrInvalidArgument].
func (o ListOptions) Validate() error {
	switch {
	case o.State < StateNotFound || o.State > StateDead:
		return fmt.Errorf("%w: list: unknown state %d", ErrInvalidArgument, int(o.State))
	case o.Limit < 0 || o.Limit > MaxListLimit:
		return fmt.Errorf("%w: list: limit %d is outside [0, %d]", ErrInvalidArgument, o.Limit, MaxListLimit)
	case o.OlderThan < 0:
		return fmt.Errorf("%w: list: older than %s is negative", ErrInvalidArgument, o.OlderThan)
	case len(o.Prefix) > MaxKeyLen || !validText(o.Prefix):
		return fmt.Errorf("%w: list: prefix must be valid UTF-8 without NUL of at most %d bytes", ErrInvalidArgument, MaxKeyLen)
	case len(o.Cursor) > 4*MaxKeyLen || !validText(o.Cursor):
		return fmt.Errorf("%w: list: malformed cursor", ErrInvalidArgument)
	}
	return nil
}

// NewLeaseID returns a random lease id: 32 hex digits, 128 bits of
// math/rand/v2's global source (ChaCha8, seeded by the runtime from the
// operating system: unpredictable, and without the system call that
// crypto/rand makes on every message). Stores use it when
// [BeginOptions.LeaseID] is empty; clients use it to make TryBegin
// retryable.
func NewLeaseID() string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], rand.Uint64())
	return hex.EncodeToString(b[:])
}
