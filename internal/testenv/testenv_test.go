package testenv_test

import (
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/watermill-inbox/inbox/internal/testenv"
)

// fakeTB records Skip and Fatal instead of acting on them.
type fakeTB struct {
	testing.TB
	skipped, failed string
}

func (f *fakeTB) Helper()                        {}
func (f *fakeTB) Skip(args ...any)               { f.skipped = strings.TrimSpace(sprint(args...)); runtime.Goexit() }
func (f *fakeTB) Fatalf(format string, a ...any) { f.failed = format; runtime.Goexit() }

func sprint(args ...any) string {
	var b strings.Builder
	for _, a := range args {
		b.WriteString(a.(string))
	}
	return b.String()
}

// run calls f on a fresh goroutine so Goexit ends only it.
func run(f func()) {
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	<-done
}

func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestService_missing_skips_and_records(t *testing.T) {
	skipFile := filepath.Join(t.TempDir(), "skips")
	t.Setenv("INBOX_SKIP_FILE", skipFile)
	t.Setenv("INBOX_REQUIRE_SERVICES", "")
	t.Setenv("INBOX_TEST_FAKE_URL", "redis://"+closedPort(t)+"/0")
	svc := testenv.Service{Name: "fake", Env: "INBOX_TEST_FAKE_URL", HowTo: "start fake"}
	f := &fakeTB{TB: t}
	run(func() { svc.URL(f) })
	if f.skipped == "" || f.failed != "" {
		t.Fatalf("skipped %q, failed %q: want a skip", f.skipped, f.failed)
	}
	data, _ := os.ReadFile(skipFile)
	if !strings.Contains(string(data), "fake (start fake)") {
		t.Fatalf("skip file holds %q", data)
	}
}

func TestService_missing_fails_when_required(t *testing.T) {
	t.Setenv("INBOX_SKIP_FILE", filepath.Join(t.TempDir(), "skips"))
	t.Setenv("INBOX_REQUIRE_SERVICES", "1")
	t.Setenv("INBOX_TEST_FAKE2_URL", "redis://"+closedPort(t)+"/0")
	f := &fakeTB{TB: t}
	run(func() { testenv.Service{Name: "fake2", Env: "INBOX_TEST_FAKE2_URL"}.URL(f) })
	if f.failed == "" {
		t.Fatal("a required missing service did not fail the test")
	}
	g := &fakeTB{TB: t}
	run(func() { testenv.Service{Name: "opt", Env: "INBOX_TEST_UNSET_OPTIONAL", Optional: true}.URL(g) })
	if g.skipped == "" || g.failed != "" {
		t.Fatalf("optional service: skipped %q failed %q; want a skip even when services are required", g.skipped, g.failed)
	}
}

func TestService_available(t *testing.T) {
	t.Setenv("INBOX_SKIP_FILE", filepath.Join(t.TempDir(), "skips"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	t.Setenv("INBOX_TEST_UP_URL", "redis://"+ln.Addr().String()+"/0")
	f := &fakeTB{TB: t}
	var got string
	run(func() { got = testenv.Service{Name: "up", Env: "INBOX_TEST_UP_URL"}.URL(f) })
	if got == "" || f.skipped != "" || f.failed != "" {
		t.Fatalf("URL %q, skipped %q, failed %q", got, f.skipped, f.failed)
	}
}

// Available reports whether a service answers, as a list of hosts
// (KAFKA_BROKERS) all of which must answer, and never skips, fails or
// records a skip, even when services are required: a test that stands in
// for a missing service (examples/kafka's, with kfake) asks it.
func TestService_Available_neither_skips_nor_records(t *testing.T) {
	skipFile := filepath.Join(t.TempDir(), "skips")
	t.Setenv("INBOX_SKIP_FILE", skipFile)
	t.Setenv("INBOX_REQUIRE_SERVICES", "1")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	up, down := ln.Addr().String(), closedPort(t)
	t.Setenv("INBOX_TEST_AVAILABLE_UP", up+","+up)
	t.Setenv("INBOX_TEST_AVAILABLE_DOWN", up+","+down)
	t.Setenv("INBOX_TEST_AVAILABLE_UNSET", "")
	for _, c := range []struct {
		env  string
		want string
		ok   bool
	}{
		{"INBOX_TEST_AVAILABLE_UP", up + "," + up, true},
		{"INBOX_TEST_AVAILABLE_DOWN", up + "," + down, false},
		{"INBOX_TEST_AVAILABLE_UNSET", "", false},
	} {
		got, ok := testenv.Service{Name: "kafka", Env: c.env}.Available()
		if got != c.want || ok != c.ok {
			t.Errorf("%s: Available() = %q, %v; want %q, %v", c.env, got, ok, c.want, c.ok)
		}
	}
	if data, err := os.ReadFile(skipFile); err == nil || !os.IsNotExist(err) {
		t.Errorf("Available recorded a skip: %q (%v)", data, err)
	}
}

// A program missing from PATH skips the test (recorded for the summary),
// or fails it when services are required; one that is there is found.
func TestProgram(t *testing.T) {
	skipFile := filepath.Join(t.TempDir(), "skips")
	t.Setenv("INBOX_SKIP_FILE", skipFile)
	t.Setenv("INBOX_REQUIRE_SERVICES", "")
	const missing = "inbox-test-no-such-program"
	f := &fakeTB{TB: t}
	run(func() { testenv.Program(f, missing, "install it") })
	if f.skipped == "" || f.failed != "" {
		t.Fatalf("skipped %q, failed %q: want a skip", f.skipped, f.failed)
	}
	if data, _ := os.ReadFile(skipFile); !strings.Contains(string(data), missing+" (install it)") {
		t.Fatalf("skip file holds %q", data)
	}
	t.Setenv("INBOX_REQUIRE_SERVICES", "1")
	g := &fakeTB{TB: t}
	run(func() { testenv.Program(g, missing, "install it") })
	if g.failed == "" {
		t.Fatal("a required missing program did not fail the test")
	}
	h := &fakeTB{TB: t}
	var got string
	run(func() { got = testenv.Program(h, "go", "install Go") })
	if got == "" || h.skipped != "" || h.failed != "" {
		t.Fatalf("go: path %q, skipped %q, failed %q", got, h.skipped, h.failed)
	}
}

func TestReport_appends_to_the_report_file(t *testing.T) {
	file := filepath.Join(t.TempDir(), "report")
	t.Setenv("INBOX_REPORT_FILE", file)
	testenv.Report(t, "ratio: %.2f", 0.5)
	testenv.Report(t, "second")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want := t.Name() + ": ratio: 0.50\n" + t.Name() + ": second\n"
	if string(data) != want {
		t.Fatalf("report file holds %q, want %q", data, want)
	}
}
