package inboxmw_test

import (
	"context"
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"strings"
	"testing"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/middleware"
)

// IsTransient's doc names every error it calls transient (its comment once
// listed four and left out the context errors, so that a handler's error
// wrapping DeadlineExceeded was never poisoned, unsaid), and the code
// agrees with it.
func TestIsTransient_doc_names_every_transient_error(t *testing.T) {
	t.Parallel()
	cases := []struct {
		err       error
		transient bool
		named     string // what the doc must say
	}{
		{inbox.ErrBusy, true, "busy"},
		{inbox.ErrStoreUnavailable, true, "unavailable"},
		{inbox.ErrClosed, true, "closing"},
		{context.Canceled, true, "context.Canceled"},
		{fmt.Errorf("payment API: %w", context.DeadlineExceeded), true, "DeadlineExceeded"},
		{&inbox.AttemptError{Err: errBoom}, true, "ErrAttemptFailed"},
		{&inbox.DeadError{Err: context.DeadlineExceeded}, false, "ErrDead"},
		{errBoom, false, "without MaxAttempts"},
	}
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, f := range pkgs["inboxmw"].Files {
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, "github.com/watermill-inbox/inbox/middleware")
	if err != nil {
		t.Fatal(err)
	}
	var text string
	for _, f := range p.Funcs {
		if f.Name == "IsTransient" {
			text = strings.Join(strings.Fields(f.Doc), " ")
		}
	}
	for _, c := range cases {
		if got := inboxmw.IsTransient(c.err); got != c.transient {
			t.Errorf("IsTransient(%v) = %v, want %v", c.err, got, c.transient)
		}
		if !strings.Contains(text, c.named) {
			t.Errorf("IsTransient's doc does not name %q (for %v)", c.named, c.err)
		}
	}
}
