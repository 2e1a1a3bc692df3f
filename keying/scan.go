package keying

import "unicode/utf8"

// Byte classes, as flags: scan ORs them over a segment.
const (
	classEscape   uint8 = 1 << iota // '%' or ':': escaped in bus, group and alias
	classNUL                        // 0x00: refused in every segment
	classNonASCII                   // 0x80 to 0xFF: the segment needs a UTF-8 check
)

var byteClass = func() (t [256]uint8) {
	t[':'] = classEscape
	t['%'] = classEscape
	t[0] = classNUL
	for c := 0x80; c < len(t); c++ {
		t[c] = classNonASCII
	}
	return t
}()

// scan measures s in one pass: its length once escaped and the union of its
// bytes' classes. Segments are short, and one pass costs less than separate
// searches for ':', '%' and NUL plus a UTF-8 check. It looks at eight bytes
// at a time, and byte by byte only at words that hold a byte of some class.
func scan(s string) (escapedLen int, classes uint8) {
	n := len(s)
	i := 0
	for ; i+8 <= len(s); i += 8 {
		w := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		if w&hiBits == 0 && !hasZeroByte(w) && !hasZeroByte(w^colons) && !hasZeroByte(w^percents) {
			continue // printable-ish ASCII without ':' or '%'
		}
		for _, c := range []byte(s[i : i+8]) {
			cl := byteClass[c]
			classes |= cl
			n += int(cl&classEscape) << 1 // +2 for each escaped byte
		}
	}
	for ; i < len(s); i++ {
		c := byteClass[s[i]]
		classes |= c
		n += int(c&classEscape) << 1
	}
	return n, classes
}

const (
	loBits   = 0x0101010101010101
	hiBits   = 0x8080808080808080
	colons   = ':' * loBits
	percents = '%' * loBits
)

// hasZeroByte reports whether a byte of w is zero.
func hasZeroByte(w uint64) bool { return (w-loBits)&^w&hiBits != 0 }

// validSegment reports whether s, whose classes scan returned, is non-empty,
// valid UTF-8 and free of NUL bytes.
func validSegment(s string, classes uint8) bool {
	return s != "" && classes&classNUL == 0 && (classes&classNonASCII == 0 || utf8.ValidString(s))
}

// escapedLen returns the length of s once escaped, and whether s holds a byte
// to escape.
func escapedLen(s string) (int, bool) {
	n, c := scan(s)
	return n, c&classEscape != 0
}
