package ferrettest_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// While the conformance suite's cases of concurrent claims skip on FerretDB
// (notAtomic), every sentence of the README and of docs/ that says the
// stores pass the suite says so where it says it: MongoDB on FerretDB, those
// cases skipped.
func TestREADME_conformance_claims_say_FerretDB_skips(t *testing.T) {
	t.Parallel()
	if notAtomic == "" {
		t.Skip("the suite runs whole on FerretDB")
	}
	root := filepath.Join("..", "..", "..")
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	claims := 0
	for _, f := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(strings.Fields(string(b)), " ")
		for _, s := range regexp.MustCompile(`[^.]*?\bpass(es)?\b[^.]*conformance[^.]*\.`).FindAllString(text, -1) {
			claims++
			if !strings.Contains(s, "FerretDB") || !strings.Contains(s, "skipped") {
				t.Errorf("%s: %q says the stores pass the conformance suite without saying that MongoDB runs it on FerretDB with the cases of concurrent claims skipped", f, strings.TrimSpace(s))
			}
		}
	}
	if claims == 0 {
		t.Fatal("no sentence of README.md or docs/ says the stores pass the conformance suite: has the claim moved?")
	}
}
