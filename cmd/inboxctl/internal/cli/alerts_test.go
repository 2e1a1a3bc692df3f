package cli_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/watermill-inbox/inbox/cmd/inboxctl/internal/cli"
	"github.com/watermill-inbox/inbox/internal/readme"
)

// The inboxctl commands that the alert rules' descriptions and
// docs/operating.md tell operators to run are commands inboxctl takes: each
// runs over a populated memory store and exits 0, its labels filled in and
// KEY a key of the store.
func TestAlertRules_commands_run(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..", "..", "..")
	fill := strings.NewReplacer("{{ $labels.bus }}", "p", "{{ $labels.group }}", "b", "KEY", kBackoff)
	command := regexp.MustCompile("`(inboxctl [^`]+)`")
	n := 0
	for _, name := range []string{"metrics/alerts.yml", "docs/operating.md"} {
		text, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range command.FindAllSubmatch(text, -1) {
			line := fill.Replace(strings.Join(strings.Fields(string(m[1])), " "))
			st := newStore(t)
			populate(t, st)
			e := onStore(shared{st})
			e.getenv = map[string]string{cli.StoreURLEnv: "memory://"} // the descriptions leave the URL to $INBOX_STORE_URL
			if r := e.run(t, readme.ShellWords(t, strings.TrimPrefix(line, "inboxctl "))...); r.code != cli.ExitOK {
				t.Errorf("%s: %q: %v", name, line, r)
			}
			n++
		}
	}
	if n < 15 {
		t.Fatalf("%d inboxctl commands found in metrics/alerts.yml and docs/operating.md, want at least 15: is the pattern still finding them?", n)
	}
}
