package importcheck_test

import (
	"os/exec"
	"strings"
	"testing"
)

// forbidden are the import path fragments of broker clients and test servers.
var forbidden = []string{
	"github.com/IBM/sarama",
	"github.com/rabbitmq/amqp091-go",
	"github.com/twmb/franz-go",
	"github.com/ThreeDotsLabs/watermill-kafka",
	"github.com/ThreeDotsLabs/watermill-amqp",
	"github.com/FerretDB",
}

// allowed are the packages (and their subpackages) that may import them.
var allowed = []string{
	"github.com/watermill-inbox/inbox/kafka",
	"github.com/watermill-inbox/inbox/amqp",
	"github.com/watermill-inbox/inbox/examples/",
	"github.com/watermill-inbox/inbox/e2e",
	"github.com/watermill-inbox/inbox/internal/importcheck",
}

func TestLibrary_imports_no_broker_client(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", `{{if not .Standard}}{{.ImportPath}} {{join .Imports ","}}{{end}}`, "github.com/watermill-inbox/inbox/...").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	// deps maps each package to its direct imports, so a violation can be
	// traced to the library package that pulls it in.
	deps := map[string][]string{}
	var ours []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, " ")
		deps[pkg] = strings.Split(imports, ",")
		if strings.HasPrefix(pkg, "github.com/watermill-inbox/inbox") && !isAllowed(pkg) {
			ours = append(ours, pkg)
		}
	}
	if len(ours) < 5 {
		t.Fatalf("found only %d library packages (%v): the listing is wrong", len(ours), ours)
	}
	for _, pkg := range ours {
		if path := forbiddenPath(pkg, deps, map[string]bool{}); path != nil {
			t.Errorf("%s depends on a broker client or test server: %s", pkg, strings.Join(path, " -> "))
		}
	}
}

func isAllowed(pkg string) bool {
	for _, a := range allowed {
		if pkg == a || strings.HasPrefix(pkg, strings.TrimSuffix(a, "/")+"/") {
			return true
		}
	}
	return false
}

// forbiddenPath returns an import chain from pkg to a forbidden package, or
// nil.
func forbiddenPath(pkg string, deps map[string][]string, seen map[string]bool) []string {
	if seen[pkg] {
		return nil
	}
	seen[pkg] = true
	for _, f := range forbidden {
		if strings.HasPrefix(pkg, f) {
			return []string{pkg}
		}
	}
	for _, imp := range deps[pkg] {
		if p := forbiddenPath(imp, deps, seen); p != nil {
			return append([]string{pkg}, p...)
		}
	}
	return nil
}
