package keying

import (
	"strings"
	"testing"
)

// scanBytewise is the reference scan: one byte at a time.
func scanBytewise(s string) (int, uint8) {
	n, classes := len(s), uint8(0)
	for i := 0; i < len(s); i++ {
		c := byteClass[s[i]]
		classes |= c
		n += int(c&classEscape) << 1
	}
	return n, classes
}

// FuzzScan checks the word-at-a-time scan against the bytewise one.
func FuzzScan(f *testing.F) {
	for _, s := range []string{"", "a", "rabbit", "orders-service", "a:b", "100%", "\x00", "caf\u00e9",
		strings.Repeat("x", 7) + ":", strings.Repeat("y", 8) + "%" + strings.Repeat("z", 9), "\xff\xfe",
		"ab\x00cdefgh", "12345678:12345678%", "::::::::%%%%%%%%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		gotN, gotC := scan(s)
		wantN, wantC := scanBytewise(s)
		if gotN != wantN || gotC != wantC {
			t.Fatalf("scan(%q) = %d, %03b; bytewise %d, %03b", s, gotN, gotC, wantN, wantC)
		}
	})
}
