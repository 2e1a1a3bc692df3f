package redisstore

import "encoding/binary"

// freshRecord is the record the fast claim writes (kind 0, see scripts.go):
// the MessagePack values 0, id, owner, hash, lease (µs) and ttl (ms), one
// after the other.
func freshRecord(id, owner, hash string, leaseUS, ttlMS int64) []byte {
	b := make([]byte, 0, 1+len(id)+len(owner)+len(hash)+3*5+2*9)
	b = append(b, 0)
	b = appendStr(b, id)
	b = appendStr(b, owner)
	b = appendStr(b, hash)
	b = appendUint(b, uint64(leaseUS))
	return appendUint(b, uint64(ttlMS))
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
