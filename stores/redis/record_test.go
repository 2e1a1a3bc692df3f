package redisstore

import (
	"errors"
	"testing"
)

// The Go decoder never panics, refuses what it cannot read with errRecord,
// and what it reads (with no negative value, which the client's writer
// cannot write) its encoder writes back to the same record. codec_test.go
// holds both against the scripts'.
func FuzzRecordDecode(f *testing.F) {
	for _, r := range []record{
		fresh("lease-1", "me", "hash", 30_000_000, 3_630_001),
		{Kind: kindCompleted, ID: "l", Lease: 128, TTL: 60_000, FreshExpiry: 1_800_000_000_000, TTL2: 3_600_000},
		{Kind: kindHeld, ID: "l", Owner: "o", Until: 1 << 50, Lease: 1, Attempts: 2, FirstSeen: 3, LastSeen: 4, Expiry: 1 << 51, Reason: "r", RetryAt: 5},
		{Kind: kindProcessed, Lease: 1000, Attempts: 1, Expiry: 1 << 51, Short: true},
		{Kind: kindDead, Reason: "poison", Expiry: 1},
	} {
		f.Add(r.encode())
	}
	f.Add([]byte{0xcc, 1, 0xd9, 1, 'l', 0xa0, 0xa0, 0xcd, 0, 1, 0xce, 0, 0, 0, 1}) // uint 8, str 8, uint 16, uint 32
	f.Add([]byte{0, 0xa5, 'l'})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decode(b)
		if err != nil {
			if !errors.Is(err, errRecord) {
				t.Fatalf("decode error %v does not wrap errRecord", err)
			}
			return
		}
		for _, v := range []int64{r.Kind, r.Lease, r.Until, r.Attempts, r.FirstSeen, r.LastSeen, r.Expiry, r.RetryAt, r.TTL, r.FreshExpiry, r.TTL2} {
			if v < 0 {
				return
			}
		}
		again, err := decode(r.encode())
		if err != nil || again != r {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", r, again, err)
		}
	})
}
