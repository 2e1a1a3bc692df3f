package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/readme"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores"
)

// The start of docs/inboxd.md, run as written on a fresh machine: its shell
// block makes the token file in an empty $HOME, then starts inboxd with the
// page's environment; only the binary (built here instead of go run), the
// Redis (the shared one, under a prefix of this test's own) and the listen
// port (any free one) differ. /readyz answers, the remote store opened with
// the same token file works, and the logs write durations as strings. The
// page's Go snippet, which opens that store, compiles.
func TestDocs_inboxd_start_serves(t *testing.T) {
	t.Parallel()
	redisURL := testenv.Redis.URL(t)
	var shBlock, goBlock *readme.Block
	for _, b := range readme.RunBy(t) {
		switch b.Lang {
		case "sh":
			shBlock = &b
		case "go":
			goBlock = &b
		default:
			t.Fatalf("%s:%d: a block of language %q is marked for this test, which runs a sh block and compiles a go block", b.File, b.Line, b.Lang)
		}
	}
	if shBlock == nil || goBlock == nil {
		t.Fatal("docs/inboxd.md marks no sh block (the start) or no go block (the consumer's store) for this test")
	}
	var setup, start []string
	for _, line := range shBlock.Lines() {
		if strings.Contains(line, "go run ./cmd/inboxd") {
			start = append(start, line)
		} else if start == nil {
			setup = append(setup, line)
		}
	}
	if len(start) != 1 {
		t.Fatalf("want one `go run ./cmd/inboxd` line in the block, got %q", shBlock.Text)
	}

	dir := t.TempDir()
	bin := filepath.Join(dir, "inboxd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "INBOX_") && !strings.HasPrefix(kv, "HOME=") {
			env = append(env, kv)
		}
	}
	env = append(env, "HOME="+home, "INBOX_LISTEN_ADDR=127.0.0.1:0")

	sh := exec.Command("sh", "-ec", strings.Join(setup, "\n"))
	sh.Env = env
	if out, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("the page's setup lines: %v\n%s", err, out)
	}
	tokenFile := filepath.Join(home, ".config", "inboxd", "token")
	if !strings.Contains(start[0], "INBOX_TOKEN_FILE=\"$HOME/.config/inboxd/token\"") {
		t.Fatalf("the page's start line %q does not read the token file its setup makes", start[0])
	}
	if tok, err := os.ReadFile(tokenFile); err != nil || len(strings.TrimSpace(string(tok))) < 32 {
		t.Fatalf("token file made by the page's setup: %q, %v", tok, err)
	}

	// The store URL: the page's query on the shared Redis, under a prefix.
	storeRE := regexp.MustCompile(`INBOX_STORE_URL='([^']*)'`)
	m := storeRE.FindStringSubmatch(start[0])
	if m == nil {
		t.Fatalf("no INBOX_STORE_URL='...' in %q", start[0])
	}
	readmeURL, err := url.Parse(m[1])
	if err != nil || readmeURL.Scheme != "redis" {
		t.Fatalf("the page's store URL %q: %v", m[1], err)
	}
	prefix := "inboxtest:readme:" + inbox.NewLeaseID() + ":"
	q := readmeURL.Query()
	q.Set("prefix", prefix)
	testURL := redisURL + "?" + q.Encode()
	cleanRedis(t, redisURL, prefix)
	cmdline := storeRE.ReplaceAllLiteralString(start[0], "INBOX_STORE_URL="+shellQuote(testURL))
	cmdline = strings.Replace(cmdline, "go run ./cmd/inboxd", "exec "+shellQuote(bin), 1)

	cmd := exec.Command("sh", "-c", cmdline)
	cmd.Env = env
	lines := startLogging(t, cmd)
	var addr string
	var listening map[string]any
	for addr == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("inboxd started as docs/inboxd.md says exited: %v", cmd.Wait())
			}
			var rec map[string]any
			if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "inboxd listening" {
				addr, _ = rec["addr"].(string)
				listening = rec
			} else {
				t.Logf("inboxd: %s", l)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("inboxd did not log its address")
		}
	}
	if listening["auth"] != "bearer" || listening["lease_default"] != "30s" {
		t.Errorf("listening line %v: want auth bearer and lease_default \"30s\" (durations as strings)", listening)
	}

	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"OK"`) {
		t.Fatalf("/readyz = %d %s, want 200 OK", resp.StatusCode, body)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := stores.Open(ctx, "http://"+addr+"/?token_file="+url.QueryEscape(tokenFile))
	if err != nil {
		t.Fatalf("the remote store with the page's token file: %v", err)
	}
	defer s.Close()
	if c, err := s.TryBegin(ctx, "readme", inbox.BeginOptions{}); err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin through the page's inboxd: %+v, %v", c, err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for range lines { // drain until inboxd closes stderr
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("inboxd after SIGTERM: %v", err)
	}

	// The Go snippet compiles as a program's file, with its own imports.
	src := filepath.Join(dir, "snippet.go")
	if err := os.WriteFile(src, []byte("package main\n\n"+goBlock.Text+"\n\nfunc main() {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	// An overlay puts the file in a directory of this module that does not
	// exist on disk, so it builds with the module's own dependencies.
	overlay := filepath.Join(dir, "overlay.json")
	virtual := filepath.Join(wd, "readmesnippet_overlay", "main.go")
	ov, _ := json.Marshal(map[string]map[string]string{"Replace": {virtual: src}})
	if err := os.WriteFile(overlay, ov, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("go", "build", "-overlay", overlay, "-o", os.DevNull, "./readmesnippet_overlay").CombinedOutput(); err != nil {
		t.Fatalf("the Go snippet of docs/inboxd.md does not compile: %v\n%s\n%s", err, out, goBlock.Text)
	}
}

// cleanRedis deletes the keys under prefix at the end of the test.
func cleanRedis(t *testing.T, raw, prefix string) {
	t.Cleanup(func() {
		rc := redis.NewClient(mustRedisOptions(t, raw))
		defer rc.Close()
		ctx := context.Background()
		iter := rc.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			rc.Del(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("deleting keys under %s: %v", prefix, err)
		}
	})
}
