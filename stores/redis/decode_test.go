package redisstore

// The Go reader of the record layouts (record.go, doc.go). The store reads
// records only through its scripts; the tests hold this reader against
// theirs, layout by layout, and against what encode writes.

import (
	"errors"
	"fmt"
	"math"
)

// errRecord is the cause of every error of decode.
var errRecord = errors.New("not a record of a known layout")

// decode reads the bytes of a record in any layout, those the client
// and the scripts' cmsgpack.pack write (the smallest integer that fits),
// and any other integer format, as the scripts' decode does.
func decode(b []byte) (record, error) {
	var d decoder
	d.b = b
	var r record
	r.Kind = d.int()
	switch r.Kind {
	case kindCompact, kindTomb, kindMarked:
		r.Attempts, r.FirstSeen = d.int(), d.int()
		if r.Kind == kindMarked {
			r.TTL2 = d.int()
		} else {
			r.LastSeen = r.FirstSeen + d.int()
		}
		r.PayloadHash = d.str()
		if r.Kind != kindTomb {
			r.ID = d.str()
		} else {
			r.Owner, r.Reason = d.str(), d.str()
		}
	default:
		r.ID, r.Owner, r.PayloadHash = d.str(), d.str(), d.str()
	}
	switch r.Kind {
	case kindCompact, kindTomb, kindMarked:
	case kindFresh:
		r.Lease, r.TTL = d.int(), d.int()
	case kindCompleted:
		r.Lease, r.TTL, r.FreshExpiry, r.TTL2 = d.int(), d.int(), d.int(), d.int()
	case kindHeld, kindProcessed, kindDead:
		r.Until, r.Lease, r.Attempts, r.FirstSeen, r.LastSeen, r.Expiry = d.int(), d.int(), d.int(), d.int(), d.int(), d.int()
		if len(d.b) == 0 && d.err == nil && r.Kind != kindDead {
			r.Short = true
			break
		}
		r.Reason, r.RetryAt = d.str(), d.int()
	default:
		if d.err == nil {
			d.err = fmt.Errorf("kind %d", r.Kind)
		}
	}
	if d.err == nil && len(d.b) > 0 {
		d.err = fmt.Errorf("%d bytes after the last value of kind %d", len(d.b), r.Kind)
	}
	if d.err != nil {
		return record{}, fmt.Errorf("%w: %w", errRecord, d.err)
	}
	return r, nil
}

// view returns r as the scripts' load returns it, given the key's absolute
// expiry (PEXPIRETIME, ms) and the Redis clock (TIME, µs), and whether it
// is live: a fresh record is kind 0 in the values of the full layout, a
// completed one and a compact processed one kind 2 (the latter's ID NUL and
// the lease fingerprint), a compact dead one kind 4, their times derived
// from the expiries; a payload hash in its compact form (compactHash); a record of
// the full layout is live until its Expiry, a short one reads as Reason ""
// and RetryAt 0. The store reads records through the scripts only: decode
// and view are the Go reader that the tests hold against theirs.
func (r record) view(expiryMS, nowUS int64) (record, bool) {
	switch r.Kind {
	case kindCompact, kindTomb, kindMarked:
		if expiryMS < 0 {
			return record{}, false
		}
		v := record{Kind: kindProcessed, PayloadHash: r.PayloadHash, Attempts: r.Attempts, FirstSeen: r.FirstSeen, LastSeen: r.LastSeen, Expiry: expiryMS * 1000}
		if r.Kind == kindMarked {
			v.LastSeen = acquiredAt(expiryMS, r.TTL2)
		}
		if r.Kind == kindTomb {
			v.Kind, v.Owner, v.Reason = kindDead, r.Owner, r.Reason
		} else if r.ID != "" {
			v.ID = "\x00" + r.ID
		}
		return v, true
	}
	r.PayloadHash = compactHash(r.PayloadHash)
	switch r.Kind {
	case kindFresh, kindCompleted:
		if expiryMS < 0 {
			return record{}, false
		}
		v := record{Kind: kindFresh, ID: r.ID, Owner: r.Owner, PayloadHash: r.PayloadHash, Lease: r.Lease, Attempts: 1, Expiry: expiryMS * 1000}
		if r.Kind == kindFresh {
			a := acquiredAt(expiryMS, r.TTL)
			v.Until, v.FirstSeen, v.LastSeen = a+r.Lease, a, a
		} else {
			v.Kind, v.FirstSeen, v.LastSeen = kindProcessed, acquiredAt(r.FreshExpiry, r.TTL), acquiredAt(expiryMS, r.TTL2)
		}
		return v, true
	}
	if r.Expiry <= nowUS {
		return record{}, false
	}
	r.Short = false
	return r, true
}

// decoder reads MessagePack values; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

// take returns the next n bytes.
func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n {
		d.err = fmt.Errorf("%d bytes missing", n-len(d.b))
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

// head returns the next value's first byte.
func (d *decoder) head(what string) byte {
	if d.err == nil && len(d.b) == 0 {
		d.err = fmt.Errorf("%s missing", what)
	}
	p := d.take(1)
	if p == nil {
		return 0
	}
	return p[0]
}

// int reads an integer of any MessagePack format that fits in an int64.
// Like the scripts, it takes negative integers, which no writer writes;
// unlike them, it refuses floats, which no writer writes either.
func (d *decoder) int() int64 {
	c := d.head("integer")
	if d.err != nil {
		return 0
	}
	switch {
	case c < 0x80 || c >= 0xe0: // positive and negative fixint
		return int64(int8(c))
	case c == 0xcc:
		return int64(d.fixed(1))
	case c == 0xcd:
		return int64(d.fixed(2))
	case c == 0xce:
		return int64(d.fixed(4))
	case c == 0xcf:
		v := d.fixed(8)
		if v > math.MaxInt64 && d.err == nil {
			d.err = fmt.Errorf("integer %d beyond int64", v)
		}
		return int64(v)
	case c == 0xd0:
		return int64(int8(d.fixed(1)))
	case c == 0xd1:
		return int64(int16(d.fixed(2)))
	case c == 0xd2:
		return int64(int32(d.fixed(4)))
	case c == 0xd3:
		return int64(d.fixed(8))
	}
	d.err = fmt.Errorf("byte %#x where an integer is due", c)
	return 0
}

// fixed reads an unsigned big-endian integer of n bytes.
func (d *decoder) fixed(n int) uint64 {
	var v uint64
	for _, c := range d.take(n) {
		v = v<<8 | uint64(c)
	}
	return v
}

// str reads a MessagePack str.
func (d *decoder) str() string {
	c := d.head("string")
	var n int
	switch {
	case d.err != nil:
		return ""
	case c&0xe0 == 0xa0:
		n = int(c & 0x1f)
	case c == 0xd9:
		n = int(d.fixed(1))
	case c == 0xda:
		n = int(d.fixed(2))
	case c == 0xdb:
		n = int(d.fixed(4))
	default:
		d.err = fmt.Errorf("byte %#x where a string is due", c)
		return ""
	}
	return string(d.take(n))
}
