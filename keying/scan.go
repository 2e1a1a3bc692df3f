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
// bytes' classes. Segments are short, and one table-driven loop costs less
// than separate searches for ':', '%' and NUL plus a UTF-8 check.
func scan(s string) (escapedLen int, classes uint8) {
	n := len(s)
	for i := 0; i < len(s); i++ {
		c := byteClass[s[i]]
		classes |= c
		n += int(c&classEscape) << 1 // +2 for each escaped byte
	}
	return n, classes
}

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
