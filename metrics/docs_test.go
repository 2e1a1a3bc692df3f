package inboxmetrics_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v2"

	"github.com/watermill-inbox/inbox/internal/readme"
	"github.com/watermill-inbox/inbox/internal/testenv"
)

// The blocks of docs/operating.md, as an operator would use them, with
// the paths they name pointed at this repository's files: Prometheus's
// configuration (the scrape jobs and the rule file) passes promtool check
// config, which also checks the rules; the command that checks the rules
// runs; Grafana's dashboard provider is a provisioning file of one file
// provider.
func TestDocs_operating_blocks(t *testing.T) {
	t.Parallel()
	promtool := testenv.Program(t, "promtool", howToPrometheus)
	dir := t.TempDir()
	rules, err := filepath.Abs("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "inboxd-token")
	if err := os.WriteFile(secret, []byte("a-token-of-at-least-16-bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	paths := strings.NewReplacer(
		"/etc/prometheus/rules/watermill-inbox.yml", rules,
		"/run/secrets/inboxd-token", secret,
	)
	var config []string
	seen := map[string]bool{}
	for _, b := range readme.RunBy(t) {
		text := paths.Replace(b.Text)
		switch {
		case b.Lang == "yaml" && (strings.Contains(text, "scrape_configs:") || strings.Contains(text, "rule_files:")):
			config = append(config, text)
			seen["prometheus"] = true
		case b.Lang == "sh":
			words := strings.Fields(text)
			if len(words) < 1 || words[0] != "promtool" {
				t.Fatalf("%s:%d: %q is not a promtool command", b.File, b.Line, text)
			}
			if out, err := exec.Command(promtool, words[1:]...).CombinedOutput(); err != nil {
				t.Errorf("%s:%d: %s: %v\n%s", b.File, b.Line, text, err, out)
			}
			seen["promtool"] = true
		case b.Lang == "yaml" && strings.Contains(text, "providers:"):
			var p struct {
				APIVersion int `yaml:"apiVersion"`
				Providers  []struct {
					Name    string            `yaml:"name"`
					Type    string            `yaml:"type"`
					Options map[string]string `yaml:"options"`
				} `yaml:"providers"`
			}
			if err := yaml.UnmarshalStrict([]byte(text), &p); err != nil {
				t.Errorf("%s:%d: Grafana's provisioning file: %v", b.File, b.Line, err)
			} else if p.APIVersion != 1 || len(p.Providers) != 1 || p.Providers[0].Type != "file" || p.Providers[0].Options["path"] == "" {
				t.Errorf("%s:%d: Grafana's provisioning file %+v: want apiVersion 1 and one file provider with a path", b.File, b.Line, p)
			}
			seen["grafana"] = true
		default:
			t.Errorf("%s:%d: a block this test does not know how to run", b.File, b.Line)
		}
	}
	for _, k := range []string{"prometheus", "promtool", "grafana"} {
		if !seen[k] {
			t.Errorf("docs/operating.md has no %s block for this test", k)
		}
	}
	file := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(file, []byte(strings.Join(config, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "config", file).CombinedOutput(); err != nil {
		t.Errorf("promtool check config of docs/operating.md's configuration: %v\n%s", err, out)
	}
}
