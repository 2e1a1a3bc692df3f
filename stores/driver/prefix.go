package driver

import "unicode/utf8"

// PrefixEnd returns the least string greater than every string that starts
// with prefix, the exclusive end of a range scan for the prefix; ok is
// false when there is none (prefix empty, or made of U+10FFFF only). The
// end is prefix with its last code point incremented: a last U+10FFFF is
// dropped and the code point before it incremented, and U+D7FF goes to
// U+E000, past the surrogates. UTF-8 orders code points as bytes, so for a
// valid UTF-8 prefix the strings in [prefix, end) compared byte for byte
// are exactly those that start with prefix, and end is valid UTF-8 itself,
// as a text parameter must be.
func PrefixEnd(prefix string) (end string, ok bool) {
	for prefix != "" {
		r, size := utf8.DecodeLastRuneInString(prefix)
		prefix = prefix[:len(prefix)-size]
		switch {
		case r == utf8.MaxRune:
			continue // no code point above it: increment the one before
		case r == 0xD7FF:
			r = 0xE000 // past the surrogates
		default:
			r++
		}
		return prefix + string(r), true
	}
	return "", false
}
