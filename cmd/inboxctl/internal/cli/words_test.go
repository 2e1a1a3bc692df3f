package cli_test

import (
	"strings"
	"testing"
)

// shellWords splits a command line of plain words and single-quoted
// strings, as the docs write them.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	inWord, quoted := false, false
	for _, c := range line {
		switch {
		case quoted && c == '\'':
			quoted = false
		case quoted:
			w.WriteRune(c)
		case c == '\'':
			quoted, inWord = true, true
		case c == ' ':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case strings.ContainsRune(`"$\|&;<>()*?`+"`", c):
			t.Fatalf("line %q: the test's splitter takes plain words and single quotes only", line)
		default:
			w.WriteRune(c)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("line %q: unterminated quote", line)
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}
