package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/watermill-inbox/inbox/internal/readme"
)

// TestQuickstart runs the program and checks what it prints: every order
// charged once, the duplicates skipped, the failed charge retried.
func TestQuickstart(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	runErr := run()
	os.Stdout = stdout
	w.Close()
	var out bytes.Buffer
	if _, err := io.Copy(&out, r); err != nil {
		t.Fatal(err)
	}
	if runErr != nil {
		t.Fatalf("run: %v\n%s", runErr, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"order-3  failed: payment gateway timeout",
		"published 8 messages for 5 orders",
		"processed 5, duplicates skipped 3, handler failures retried 1",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "times charged: 2"); n != 0 {
		t.Errorf("an order was charged twice:\n%s", got)
	}
}

// TestREADME_quickstart_output runs the README's command, `go run
// ./examples/quickstart` from the repository's root, and wants what the
// README shows it print, line for line.
func TestREADME_quickstart_output(t *testing.T) {
	t.Parallel()
	blocks := readme.RunBy(t)
	lines := blocks[0].Lines()
	const command = "$ go run ./examples/quickstart"
	if len(blocks) != 1 || lines[0] != command {
		t.Fatalf("want one block starting with %q, got %q", command, blocks)
	}
	cmd := exec.Command("go", "run", "./examples/quickstart")
	cmd.Dir = readme.Root(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", command, err, stderr.String())
	}
	if want := strings.Join(lines[1:], "\n") + "\n"; string(out) != want {
		t.Fatalf("%s printed:\n%s\nthe README shows:\n%s", command, out, want)
	}
}
