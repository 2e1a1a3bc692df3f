package redisstore

import "encoding/binary"

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

	// Kinds 0 and 3: the physical TTL the fresh record was written with
	// (ttl, ms); kind 3 also the fresh record's absolute expiry (E1, ms)
	// and its own TTL (ttl2, ms).
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

// appendUint appends v as a MessagePack positive fixint or uint 64.
func appendUint(b []byte, v uint64) []byte {
	if v < 0x80 {
		return append(b, byte(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}
