package stores

import (
	"os/exec"
	"strings"
	"testing"
)

// The packages that the error of an unknown scheme names exist.
func TestShipped_names_packages_of_the_module(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	var pkgs []string
	for _, p := range shipped {
		if !seen[p] {
			seen[p] = true
			pkgs = append(pkgs, p)
		}
	}
	out, err := exec.Command("go", append([]string{"list", "-f", "{{.ImportPath}} {{len .GoFiles}}"}, pkgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list of the shipped drivers' packages: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.HasSuffix(line, " 0") {
			t.Errorf("%s has no Go files", strings.TrimSuffix(line, " 0"))
		}
	}
}
