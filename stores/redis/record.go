package redisstore

import (
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
)

// The Go side of the record codec: the writer (the reader the tests hold
// against the scripts' is in decode_test.go). The layouts are described
// once, in "Record layouts" in doc.go; the scripts' side is decode and load
// in scripts.go.

// Kinds of record: the first value of every layout.
const (
	kindFresh     = 0 // written by the fast claim only
	kindHeld      = 1 // in flight, released or in a backoff
	kindProcessed = 2
	kindCompleted = 3 // a completed fresh record
	kindDead      = 4
	kindCompact   = 5 // processed, compact
	kindTomb      = 6 // dead, compact
	kindMarked    = 7 // processed, compact, by the short way of Complete
)

// record is the record of one inbox key: the values its bytes hold (see
// "Record layouts" in doc.go), or, from view, the record as the scripts'
// load returns it. Fields are exported for the tests (export_test.go);
// the type is not.
type record struct {
	Kind                   int64
	ID, Owner, PayloadHash string

	// Lease (ln) is in every layout, µs.
	Lease int64

	// Kinds 1, 2 and 4, µs of the Redis clock. Short is the layout of ten
	// values, without Reason and RetryAt, which older versions wrote (kinds
	// 1 and 2 only); it reads as Reason "" and RetryAt 0.
	Until, Attempts, FirstSeen, LastSeen, Expiry int64
	Reason                                       string
	RetryAt                                      int64
	Short                                        bool

	// Kinds 5 and 6 hold Kind, Attempts, FirstSeen, LastSeen (as the time
	// from FirstSeen), PayloadHash, and ID (kind 5: the lease
	// fingerprint, 8 bytes or none) or Owner and Reason (kind 6). Kind 7
	// holds those of kind 5 but LastSeen, which its TTL2 gives.

	// Kinds 0 and 3: the physical TTL the fresh record was written with
	// (ttl, ms); kind 3 also the fresh record's absolute expiry (E1, ms)
	// and its own TTL (ttl2, ms), as kind 7.
	TTL, FreshExpiry, TTL2 int64
}

// fresh returns the fresh record (kind 0) of a claim of a new key: lease
// in µs, the physical TTL in ms.
func fresh(id, owner, hash string, leaseUS, ttlMS int64) record {
	return record{Kind: kindFresh, ID: id, Owner: owner, PayloadHash: hash, Lease: leaseUS, TTL: ttlMS}
}

// encode returns the bytes of r in the layout of its kind.
func (r record) encode() []byte {
	n := 1 + 3*5 + len(r.ID) + len(r.Owner) + len(r.PayloadHash) // kind and strings, at most
	switch r.Kind {
	case kindFresh:
		n += 2 * 9
	case kindCompleted:
		n += 4 * 9
	default:
		n += 6*9 + 5 + len(r.Reason) + 9
	}
	b := make([]byte, 0, n)
	b = appendUint(b, uint64(r.Kind))
	switch r.Kind {
	case kindCompact:
		b = appendInts(b, r.Attempts, r.FirstSeen, r.LastSeen-r.FirstSeen)
		return appendStr(appendStr(b, r.PayloadHash), r.ID)
	case kindMarked:
		b = appendInts(b, r.Attempts, r.FirstSeen, r.TTL2)
		return appendStr(appendStr(b, r.PayloadHash), r.ID)
	case kindTomb:
		b = appendInts(b, r.Attempts, r.FirstSeen, r.LastSeen-r.FirstSeen)
		return appendStr(appendStr(appendStr(b, r.PayloadHash), r.Owner), r.Reason)
	}
	b = appendStr(b, r.ID)
	b = appendStr(b, r.Owner)
	b = appendStr(b, r.PayloadHash)
	switch r.Kind {
	case kindFresh:
		return appendInts(b, r.Lease, r.TTL)
	case kindCompleted:
		return appendInts(b, r.Lease, r.TTL, r.FreshExpiry, r.TTL2)
	}
	b = appendInts(b, r.Until, r.Lease, r.Attempts, r.FirstSeen, r.LastSeen, r.Expiry)
	if r.Short {
		return b
	}
	return appendUint(appendStr(b, r.Reason), uint64(r.RetryAt))
}

// marked returns the compact processed record (kind 7) that the short way
// of Complete writes for the fast claim of leaseID at acquired (µs), with
// the payload hash hash (compact), for a retention of ttlMS.
func marked(leaseID, hash string, acquired, ttlMS int64) record {
	return record{Kind: kindMarked, ID: fingerprint(leaseID), PayloadHash: hash, Attempts: 1, FirstSeen: acquired, TTL2: ttlMS}
}

// fingerprint is what a compact processed record keeps of the lease id that
// completed it: the first 8 bytes of its SHA-1 (the scripts' fp, from
// redis.sha1hex). A repeated Complete compares it; a stale holder's lease id
// matches it with a probability of 2^-64.
func fingerprint(leaseID string) string {
	sum := sha1.Sum([]byte(leaseID))
	return string(sum[:8])
}

// compactHash is the form in which the store keeps a payload hash: one of
// 64 lowercase hex digits (the middleware's SHA-256) becomes a NUL and its
// first 16 bytes, which tell two payloads apart as well; any other is kept
// as it is (a payload hash never holds a NUL). The scripts' hash does the
// same to the hashes of records that older versions wrote.
func compactHash(h string) string {
	if len(h) != 64 {
		return h
	}
	var b [17]byte
	for i := range 64 {
		if c := h[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return h
		}
	}
	if _, err := hex.Decode(b[1:], []byte(h[:32])); err != nil {
		return h
	}
	return string(b[:])
}

// shownHash is the payload hash Get returns for one the store keeps: a
// compact SHA-256 as its first 16 bytes in hex, any other as it is.
func shownHash(h string) string {
	if len(h) == 17 && h[0] == 0 {
		return hex.EncodeToString([]byte(h[1:]))
	}
	return h
}

// acquiredAt is the time of the fast claim's SET, in µs, rounded down to
// the millisecond: the absolute expiry it gave the key (PEXPIRETIME, ms)
// minus the TTL it was written with (ms).
func acquiredAt(expiryMS, ttlMS int64) int64 { return (expiryMS - ttlMS) * 1000 }

func appendInts(b []byte, v ...int64) []byte {
	for _, x := range v {
		b = appendUint(b, uint64(x))
	}
	return b
}

// appendStr appends s as a MessagePack str.
func appendStr(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= 0xff:
		b = append(b, 0xd9, byte(n))
	case n <= 0xffff:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

// appendUint appends v as a MessagePack positive fixint, uint 8, 16, 32
// or 64, the smallest that holds it, as the scripts' cmsgpack.pack does.
func appendUint(b []byte, v uint64) []byte {
	switch {
	case v < 0x80:
		return append(b, byte(v))
	case v <= 0xff:
		return append(b, 0xcc, byte(v))
	case v <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}
