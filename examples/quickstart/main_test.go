package main

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
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
