package sqlstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
)

// The compact forms of a row's payload hash and lease.
//
// A payload hash that is hex SHA-256 (64 lowercase hex digits, as the
// middleware computes it) is kept as its first 16 bytes, which tell two
// payloads apart; Get reads it back as those 16 bytes in hex. Any other
// hash (an opaque one of the caller's) is kept as its bytes, with a NUL
// after one of exactly 16 bytes, so that it is never read as a prefix
// (hashes hold no NUL). No hash is NULL.
//
// The lease column holds the full lease id while the lease is in flight
// (state open), and once the key is processed only the fingerprint of the
// lease that completed it (leaseFP): enough for a repeated Complete of that
// lease to succeed and for any other lease's to fail.

// hashPrefixLen is the length of the kept prefix of a hex SHA-256 hash.
const hashPrefixLen = 16

// encodeHash returns the compact form of a payload hash, nil for none.
func encodeHash(h string) []byte {
	switch {
	case h == "":
		return nil
	case isHexSHA256(h):
		b, _ := hex.DecodeString(h[:2*hashPrefixLen])
		return b
	case len(h) == hashPrefixLen:
		return append([]byte(h), 0)
	}
	return []byte(h)
}

// decodeHash returns what Get reports of a kept payload hash.
func decodeHash(b []byte) string {
	switch {
	case len(b) == hashPrefixLen:
		return hex.EncodeToString(b)
	case len(b) == hashPrefixLen+1 && b[hashPrefixLen] == 0:
		return string(b[:hashPrefixLen])
	}
	return string(b)
}

// hashMismatch reports whether the payload hash h of a claim differs from
// the row's kept one (neither empty), comparing compact forms.
func hashMismatch(h string, kept []byte) bool {
	return h != "" && kept != nil && !bytes.Equal(encodeHash(h), kept)
}

func isHexSHA256(h string) bool {
	if len(h) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// leaseFPLen is the length of a lease fingerprint.
const leaseFPLen = 8

// leaseFP is the fingerprint a processed row keeps of the lease that
// completed it: the first 8 bytes of the SHA-256 of the lease id. The SQL
// of PostgreSQL and MySQL computes the same (substr(sha256(lease), 1, 8);
// UNHEX(LEFT(SHA2(lease, 256), 16))).
func leaseFP(leaseID string) []byte {
	sum := sha256.Sum256([]byte(leaseID))
	return sum[:leaseFPLen]
}

// leaseBytes is a lease id as the lease column holds it, nil for none.
func leaseBytes(leaseID string) []byte {
	if leaseID == "" {
		return nil
	}
	return []byte(leaseID)
}
