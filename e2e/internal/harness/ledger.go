package harness

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
)

// Ledger counts applications of the handler's effect, one per line, across
// processes.
type Ledger interface {
	// Counts returns how many times each id's effect was applied.
	Counts(t testing.TB) map[string]int
}

// FileLedger is an append-only file shared by the test and its child
// processes: each application of an effect appends one line (the message's
// id) with a single O_APPEND write, so lines from several processes never
// interleave and none is lost when a process is killed after the write.
type FileLedger struct {
	Path string

	once sync.Once
	f    *os.File
	err  error
}

// NewFileLedger creates an empty ledger file in the test's temporary
// directory.
func NewFileLedger(t testing.TB) *FileLedger {
	t.Helper()
	path := t.TempDir() + "/ledger"
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatalf("creating the ledger: %v", err)
	}
	return &FileLedger{Path: path}
}

// Apply appends id: one application of its effect.
func (l *FileLedger) Apply(id string) error {
	if strings.ContainsAny(id, "\n\r") {
		return fmt.Errorf("ledger: id %q holds a line break", id)
	}
	l.once.Do(func() {
		l.f, l.err = os.OpenFile(l.Path, os.O_APPEND|os.O_WRONLY, 0)
	})
	if l.err != nil {
		return fmt.Errorf("ledger: %w", l.err)
	}
	if _, err := l.f.Write([]byte(id + "\n")); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	return nil
}

// Close closes the ledger's file, if Apply opened it.
func (l *FileLedger) Close() error {
	if l.f != nil {
		return l.f.Close()
	}
	return nil
}

// Counts reads the ledger.
func (l *FileLedger) Counts(t testing.TB) map[string]int {
	t.Helper()
	b, err := os.ReadFile(l.Path)
	if err != nil {
		t.Fatalf("reading the ledger: %v", err)
	}
	counts := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		counts[sc.Text()]++
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the ledger: %v", err)
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		t.Fatalf("the ledger ends in a partial line: %q", b[max(0, len(b)-40):])
	}
	return counts
}

// Lines returns the ledger's lines, in the order they were written.
func (l *FileLedger) Lines(t testing.TB) []string {
	t.Helper()
	b, err := os.ReadFile(l.Path)
	if err != nil {
		t.Fatalf("reading the ledger: %v", err)
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		t.Fatalf("the ledger ends in a partial line: %q", b[max(0, len(b)-40):])
	}
	s := strings.TrimSuffix(string(b), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}
