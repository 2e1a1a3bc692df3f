package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
)

// rootModule is the module path of the library, whose cmd/inboxctl the
// suite builds.
const rootModule = "github.com/watermill-inbox/inbox"

// inboxctl is the operators' command line, built once per test process
// (by the first test that runs it) from the root module's cmd/inboxctl:
// the real program, as an operator runs it. Main removes it at the end.
var inboxctl struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// buildInboxctl builds cmd/inboxctl into a temporary directory.
func buildInboxctl() {
	root, err := findRootModule()
	if err != nil {
		inboxctl.err = err
		return
	}
	if inboxctl.dir, err = os.MkdirTemp("", "inbox-e2e-inboxctl-"); err != nil {
		inboxctl.err = err
		return
	}
	bin := filepath.Join(inboxctl.dir, "inboxctl")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./cmd/inboxctl")...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		inboxctl.err = fmt.Errorf("go build ./cmd/inboxctl in %s: %v\n%s", root, err, out)
		return
	}
	inboxctl.bin = bin
}

// removeInboxctl removes the binary, if it was built.
func removeInboxctl() {
	if inboxctl.dir != "" {
		_ = os.RemoveAll(inboxctl.dir)
	}
}

// findRootModule returns the directory of the library's go.mod, above the
// working directory (the e2e module's, or e2e/mongo's).
func findRootModule() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			sc := bufio.NewScanner(bytes.NewReader(b))
			for sc.Scan() {
				if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "module" && f[1] == rootModule {
					return dir, nil
				}
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of module %s above the working directory", rootModule)
		}
		dir = parent
	}
}

// Inboxctl runs inboxctl with args and returns its standard output; it
// fails the test unless the program exits with status 0.
func Inboxctl(t testing.TB, args ...string) string {
	t.Helper()
	inboxctl.once.Do(buildInboxctl)
	if inboxctl.err != nil {
		t.Fatalf("building inboxctl: %v", inboxctl.err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, inboxctl.bin, args...)
	cmd.Env = append(os.Environ(), "INBOX_STORE_URL=") // only -store says which store
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("inboxctl %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// CtlRecord is a record of inboxctl's -json output (the fields the suite
// reads).
type CtlRecord struct {
	Key      string `json:"key"`
	Status   string `json:"status"`
	Attempts int    `json:"attempts"`
	Reason   string `json:"reason"`
}

// parseCtlJSON parses inboxctl's -json output: one object a line.
func parseCtlJSON(t testing.TB, out string) []CtlRecord {
	t.Helper()
	var recs []CtlRecord
	for _, line := range strings.Split(out, "\n") {
		if line == "" {
			continue
		}
		var r CtlRecord
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("inboxctl -json printed a line that is not a JSON record: %q: %v", line, err)
		}
		recs = append(recs, r)
	}
	return recs
}

// lsDead lists the dead keys under prefix as an operator does: inboxctl ls
// -state dead over the consumers' store URL, as text and as -json. A store
// that only this process can reach (memory, shared by the case's
// consumers) is listed through its inbox.Admin instead; text is then "".
func (e *env) lsDead(t *testing.T, prefix string) (text string, recs []CtlRecord) {
	t.Helper()
	if e.store.Shared != nil {
		a, ok := e.store.Shared.(inbox.Admin)
		if !ok {
			t.Fatalf("the store %T does not implement inbox.Admin", e.store.Shared)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for opts := (inbox.ListOptions{State: inbox.StateDead, Prefix: prefix}); ; {
			page, err := a.List(ctx, opts)
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			for _, it := range page.Items {
				recs = append(recs, CtlRecord{Key: it.Key, Status: it.State.String(), Attempts: it.Attempts, Reason: it.Reason})
			}
			if opts.Cursor = page.Next; opts.Cursor == "" {
				return "", recs
			}
		}
	}
	url := e.spec.Store.URL
	text = Inboxctl(t, "-store", url, "ls", "-state", "dead", "-prefix", prefix)
	return text, parseCtlJSON(t, Inboxctl(t, "-store", url, "-json", "ls", "-state", "dead", "-prefix", prefix))
}

// forget forgets key as an operator does (inboxctl forget, or the memory
// store's inbox.Admin), and returns what inboxctl printed.
func (e *env) forget(t *testing.T, key string) string {
	t.Helper()
	if e.store.Shared != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.store.Shared.(inbox.Admin).Forget(ctx, key); err != nil {
			t.Fatalf("Forget(%s): %v", key, err)
		}
		return ""
	}
	return Inboxctl(t, "-store", e.spec.Store.URL, "forget", key)
}
