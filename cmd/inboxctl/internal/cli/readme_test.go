package cli_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/watermill-inbox/inbox/cmd/inboxctl/internal/cli"
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
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	const heading = "\n## Operating the inbox: `inboxctl`\n"
	_, sec, ok := strings.Cut(string(b), heading)
	if !ok {
		t.Fatalf("README.md has no section %q", strings.TrimSpace(heading))
	}
	if i := strings.Index(sec, "\n## "); i >= 0 {
		sec = sec[:i]
	}
	st := newStore(t)
	populate(t, st)
	e := onStore(shared{st})
	e.migrator = fakeMigrator
	n := 0
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile("(?s)\n```sh\n(.*?)\n```").FindAllStringSubmatch(sec, -1) {
		for _, line := range strings.Split(m[1], "\n") {
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
	for _, c := range []string{"get", "ls", "release", "forget", "migrate"} {
		if !seen[c] {
			t.Errorf("the README's examples never run %s", c)
		}
	}
	if !strings.Contains(sec, "go run ./cmd/inboxctl -store redis://127.0.0.1:6379/0 ls -state in-progress\n") {
		t.Error("the README lacks the acceptance command")
	}
	if n == 0 {
		t.Fatal("the README's inboxctl section has no sh block")
	}
}
