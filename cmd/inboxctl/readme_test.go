package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/readme"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores"
)

var timeRE = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)

// normalize makes a line of output comparable: times (which differ from
// run to run) are one placeholder, runs of white space (a table's
// alignment) one space.
func normalize(line string) string {
	return strings.Join(strings.Fields(timeRE.ReplaceAllString(line, "<time>")), " ")
}

// matches reports whether got (lines) is what want (lines) shows, where a
// line "..." of want stands for any number of lines of got.
func matches(want, got []string) bool {
	if len(want) == 0 {
		return len(got) == 0
	}
	if want[0] == "..." {
		for i := 0; i <= len(got); i++ {
			if matches(want[1:], got[i:]) {
				return true
			}
		}
		return false
	}
	return len(got) > 0 && normalize(want[0]) == normalize(got[0]) && matches(want[1:], got[1:])
}

// The README's inboxctl transcript runs as written against the shared
// Redis, under a prefix of the test's own (the only change to the
// commands: the -store URL's database and prefix), on a store holding what
// the transcript shows (a lease held on rabbit:billing:charge:42, a dead
// rabbit:billing:charge:7); each command's output is the one the README
// shows after it, times and the alignment of columns aside, a line "..."
// standing for lines not shown.
func TestREADME_commands_run(t *testing.T) {
	t.Parallel()
	base := testenv.Redis.URL(t)
	storeURL := withParams(t, base, "prefix", "inboxctl-readme-"+randomName(t)+":")
	ctx := ctxT(t, time.Minute)
	st, err := stores.Open(ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	held, dead := "rabbit:billing:charge:42", "rabbit:billing:charge:7"
	t.Cleanup(func() {
		for _, k := range []string{held, dead} {
			_ = st.(inbox.Admin).Forget(context.Background(), k)
		}
	})
	if c, err := st.TryBegin(ctx, held, inbox.BeginOptions{Owner: "consumer-1/4242"}); err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin(%s) = %+v, %v", held, c, err)
	}
	c, err := st.TryBegin(ctx, dead, inbox.BeginOptions{Owner: "consumer-2/77"})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin(%s) = %+v, %v", dead, c, err)
	}
	if err := st.Fail(ctx, dead, c.LeaseID, inbox.FailOptions{Dead: true, Reason: "card declined: insufficient funds"}); err != nil {
		t.Fatal(err)
	}

	seen := runTranscript(t, readme.RunBy(t), storeURL)
	for _, c := range []string{"get", "ls", "release", "forget", "migrate", "-stuck", "-force", "-dry-run", "-json"} {
		if !seen[c] {
			t.Errorf("the README's transcript never runs %s", c)
		}
	}
}

// The transcript's comparison: times and alignment aside, every line; a
// line "..." stands for any number of lines.
func TestREADME_transcript_comparison(t *testing.T) {
	t.Parallel()
	got := []string{"KEY   STATE", "k1    Dead  2026-11-27T09:14:03.5Z", "k2    Dead", "done"}
	for _, tc := range []struct {
		want []string
		ok   bool
	}{
		{[]string{"KEY STATE", "k1 Dead 2001-01-01T00:00:00Z", "k2 Dead", "done"}, true},
		{[]string{"KEY STATE", "...", "done"}, true},
		{[]string{"...", "k2 Dead", "done"}, true},
		{[]string{"KEY STATE", "..."}, true},
		{[]string{"KEY STATE", "k1 Dead <time>", "done"}, false},
		{[]string{"KEY STATE", "k1 Processed 2001-01-01T00:00:00Z", "..."}, false},
		{[]string{"KEY STATE", "k1 Dead 2001-01-01T00:00:00Z", "k2 Dead", "done", "more"}, false},
		{nil, false},
	} {
		if matches(tc.want, got) != tc.ok {
			t.Errorf("matches(%q) = %v, want %v", tc.want, !tc.ok, tc.ok)
		}
	}
}

// runTranscript runs blocks (the docs' blocks marked for the calling test),
// transcripts of `$ go run ./cmd/inboxctl` commands each followed by what
// it prints, on the store at storeURL (which the transcripts call
// redis://127.0.0.1:6379/0), and checks that each command exits 0 and
// prints what the transcript shows, times and the alignment of columns
// aside, a line "..." standing for lines not shown. It returns the words
// the commands used.
func runTranscript(t *testing.T, blocks []readme.Block, storeURL string) map[string]bool {
	t.Helper()
	const docStore = "redis://127.0.0.1:6379/0"
	var steps [][]string // each: the command line, then the output shown
	for _, b := range blocks {
		for _, line := range b.Lines() {
			if cmd, ok := strings.CutPrefix(line, "$ "); ok {
				steps = append(steps, []string{cmd})
			} else if len(steps) == 0 {
				t.Fatalf("%s:%d: line %q comes before the first command ($ ...)", b.File, b.Line, line)
			} else {
				steps[len(steps)-1] = append(steps[len(steps)-1], line)
			}
		}
	}
	if len(steps) == 0 {
		t.Fatal("the transcript has no command")
	}
	seen := map[string]bool{}
	var transcript strings.Builder
	failed := false
	for _, step := range steps {
		args, ok := strings.CutPrefix(step[0], "go run ./cmd/inboxctl ")
		if !ok {
			t.Fatalf("transcript line %q is not a `$ go run ./cmd/inboxctl` command", step[0])
		}
		words := readme.ShellWords(t, args)
		for i, w := range words {
			seen[w] = true
			if w == docStore {
				words[i] = storeURL
			}
		}
		r := ctl(t, words...)
		got := strings.Split(strings.TrimSuffix(r.stdout+r.stderr, "\n"), "\n")
		fmt.Fprintf(&transcript, "$ %s\n%s", step[0], r.stdout+r.stderr)
		if r.code != 0 || !matches(step[1:], got) {
			t.Errorf("transcript's %q: exit %d, printed:\n%s\nwant exit 0 and:\n%s", step[0], r.code, r.stdout+r.stderr, strings.Join(step[1:], "\n"))
			failed = true
		}
	}
	if failed {
		t.Logf("the transcript as it ran:\n%s", transcript.String())
	}
	return seen
}

// docs/operating.md's order-key transcript runs as written against the
// shared Redis, under a prefix of the test's own, on a store where the
// dead rabbit:billing:charge:7 heads the order key
// rabbit:billing:charge:acct-9 and two keys wait behind it.
func TestDocs_order_commands_run(t *testing.T) {
	t.Parallel()
	storeURL := withParams(t, testenv.Redis.URL(t), "prefix", "inboxctl-docs-order-"+randomName(t)+":")
	ctx := ctxT(t, time.Minute)
	st, err := stores.Open(ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ok, dead, waiting := "rabbit:billing:charge:acct-9", "rabbit:billing:charge:7", []string{"rabbit:billing:charge:8", "rabbit:billing:charge:9"}
	t.Cleanup(func() {
		for _, k := range append([]string{dead}, waiting...) {
			_ = st.(inbox.Admin).Forget(context.Background(), k)
		}
		// Let the order key go, so that its gate does not outlive the test.
		for range 3 {
			if g, err := st.(inbox.OrderAdmin).Order(context.Background(), ok); err == nil && g.Head != "" {
				_ = st.(inbox.OrderAdmin).ReleaseOrder(context.Background(), ok, g.Head)
			}
		}
	})
	c, err := st.TryBegin(ctx, dead, inbox.BeginOptions{Owner: "consumer-2/77", OrderKey: ok})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin(%s) = %+v, %v", dead, c, err)
	}
	if err := st.Fail(ctx, dead, c.LeaseID, inbox.FailOptions{Dead: true, OrderKey: ok, Reason: "card declined: insufficient funds"}); err != nil {
		t.Fatal(err)
	}
	for _, k := range waiting {
		if c, err := st.TryBegin(ctx, k, inbox.BeginOptions{OrderKey: ok}); err != nil || c.Status != inbox.Behind {
			t.Fatalf("TryBegin(%s) = %+v, %v; want Behind", k, c, err)
		}
	}
	seen := runTranscript(t, readme.RunBy(t), storeURL)
	for _, c := range []string{"order", "order-release", "-dry-run"} {
		if !seen[c] {
			t.Errorf("the transcript never runs %s", c)
		}
	}
}
