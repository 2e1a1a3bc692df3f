package inboxmw

import (
	"strings"
	"testing"
)

// TestAppendLeaseID_random_hex checks the SWAR hex encoding: 32 lowercase hex
// digits, appended after what dst holds, every digit value seen in every
// position, no id repeated.
func TestAppendLeaseID_random_hex(t *testing.T) {
	t.Parallel()
	const n = 20000
	seen := make(map[string]bool, n)
	var perPos [leaseIDLen][16]int
	for range n {
		b := appendLeaseID([]byte("k:"))
		if !strings.HasPrefix(string(b), "k:") || len(b) != 2+leaseIDLen {
			t.Fatalf("appendLeaseID(%q) = %q", "k:", b)
		}
		id := string(b[2:])
		if seen[id] {
			t.Fatalf("lease id %s twice in %d", id, n)
		}
		seen[id] = true
		for i, c := range []byte(id) {
			d := strings.IndexByte("0123456789abcdef", c)
			if d < 0 {
				t.Fatalf("lease id %q holds %q, not a lowercase hex digit", id, c)
			}
			perPos[i][d]++
		}
	}
	for i, counts := range perPos {
		for d, c := range counts { // expect n/16 = 1250 each
			if c < 1000 || c > 1500 {
				t.Errorf("position %d: digit %x seen %d times in %d ids, want about %d", i, d, c, n, n/16)
			}
		}
	}
}

// TestHexDigits checks the digit of every nibble value.
func TestHexDigits(t *testing.T) {
	t.Parallel()
	for v := range uint64(16) {
		got := byte(hexDigits(v))
		if want := "0123456789abcdef"[v]; got != want {
			t.Errorf("hexDigits(%d) = %q, want %q", v, got, want)
		}
	}
	// spreadNibbles places each nibble in a byte of its own, none lost.
	const x = 0x89abcdef
	v := spreadNibbles(x)
	var sum, or uint64
	for i := range 8 {
		b := v >> (8 * i) & 0xff
		if b > 15 {
			t.Fatalf("spreadNibbles(%#x) byte %d = %#x, more than a nibble", uint32(x), i, b)
		}
		sum += b
		or |= 1 << b
	}
	if sum != 8+9+10+11+12+13+14+15 || or != 0xff00 {
		t.Errorf("spreadNibbles(%#x) = %#x: nibbles lost or duplicated", uint32(x), v)
	}
}
