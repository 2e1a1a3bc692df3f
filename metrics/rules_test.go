package inboxmetrics_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/watermill-inbox/inbox/internal/testenv"
)

// howToPrometheus tells a developer how to get promtool and prometheus.
const howToPrometheus = "install the Debian package prometheus, promtool and the server, as .ci/run does"

// The alert rules are valid for Prometheus (promtool check rules, its lint
// fatal) and pass their unit tests (alerts_test.yml).
func TestAlertRules(t *testing.T) {
	t.Parallel()
	promtool := testenv.Program(t, "promtool", howToPrometheus)
	for _, args := range [][]string{
		{"check", "rules", "--lint=all", "--lint-fatal", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// The log lines the alerts' descriptions send operators to (the log line
// "..."), are lines the middleware writes: each is in its source.
func TestAlertRules_quote_log_lines_the_middleware_writes(t *testing.T) {
	t.Parallel()
	rules, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	quoted := regexp.MustCompile(`log\s+line\s+"([^"]+)"`).FindAllSubmatch(rules, -1)
	if len(quoted) < 4 {
		t.Fatalf("alerts.yml quotes %d log lines, want at least 4: is the pattern still finding them?", len(quoted))
	}
	files, err := filepath.Glob(filepath.Join("..", "middleware", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var src strings.Builder
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	for _, q := range quoted {
		line := strings.Join(strings.Fields(string(q[1])), " ")
		if !strings.Contains(src.String(), `"`+line) {
			t.Errorf("alerts.yml sends operators to the log line %q, which no log call of ../middleware begins with", line)
		}
	}
}
