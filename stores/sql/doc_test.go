package sqlstore_test

import (
	"os/exec"
	"strings"
	"testing"
)

// go doc of the package is short enough to read (issue 30: it was 266
// lines); depth goes to docs/stores.md.
func TestDoc_go_doc_at_most_150_lines(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "doc", ".").Output()
	if err != nil {
		t.Fatalf("go doc .: %v", err)
	}
	if n := strings.Count(string(out), "\n"); n > 150 {
		t.Fatalf("go doc . is %d lines, more than 150: move depth to docs/stores.md", n)
	}
}
