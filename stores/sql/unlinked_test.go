package sqlstore_test

import (
	"os/exec"
	"strings"
	"testing"
)

// A program that imports package sqlstore but no dialect package links no
// database/sql driver; each way to a store then fails at once, naming the
// package to import, and DDL, which needs no driver, works.
func TestUnlinked_dialect_names_its_package(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "run", "./testdata/unlinked").CombinedOutput()
	if err != nil {
		t.Fatalf("go run ./testdata/unlinked: %v\n%s", err, out)
	}
	const pkg = "github.com/watermill-inbox/inbox/stores/sql/"
	for _, want := range []string{
		`New: inbox: invalid argument: sql store: dialect postgres is not linked into this program: import _ "` + pkg + `postgres"`,
		`txinbox.New: txinbox: Dialect: inbox: invalid argument: sql store: dialect mysql is not linked into this program: import _ "` + pkg + `mysql"`,
		`stores.Open: stores: unknown URL scheme "sqlite" (import _ "` + pkg + `sqlite" to register it)`,
		"DDL: true <nil>",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
}
