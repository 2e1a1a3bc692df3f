package inboxmetrics_test

import (
	"os/exec"
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
