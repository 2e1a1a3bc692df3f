package cli_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/watermill-inbox/inbox/cmd/inboxctl/internal/cli"
	"github.com/watermill-inbox/inbox/internal/readme"
)

// shellWords splits a command line of plain words and single-quoted
// strings, as the README writes them.
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
			t.Fatalf("README line %q: the test's splitter takes plain words and single quotes only", line)
		default:
			w.WriteRune(c)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("README line %q: unterminated quote", line)
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// The README's inboxctl commands run as written (over a populated memory
// store instead of the Redis and PostgreSQL they name) and exit 0.
func TestREADME_commands_run(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	populate(t, st)
	e := onStore(shared{st})
	e.migrator = fakeMigrator
	n := 0
	seen := map[string]bool{}
	var all []string
	for _, b := range readme.RunBy(t) {
		for _, line := range b.Lines() {
			all = append(all, line)
			args, ok := strings.CutPrefix(line, "go run ./cmd/inboxctl ")
			if !ok {
				t.Fatalf("README line %q is not a `go run ./cmd/inboxctl` command", line)
			}
			words := shellWords(t, args)
			if r := e.run(t, words...); r.code != cli.ExitOK {
				t.Errorf("README's %q: %v", line, r)
			}
			for _, w := range words {
				seen[w] = true
			}
			n++
		}
	}
	for _, c := range []string{"get", "ls", "release", "forget", "migrate", "-stuck", "-force", "-dry-run"} {
		if !seen[c] {
			t.Errorf("the README's examples never run %s", c)
		}
	}
	if !slices.Contains(all, "go run ./cmd/inboxctl -store redis://127.0.0.1:6379/0 ls -state in-progress") {
		t.Error("the README lacks the acceptance command")
	}
	if n == 0 {
		t.Fatal("the README's inboxctl block has no command")
	}
}
