package inboxmetrics_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// constValues returns the string values of the constants of package dir
// (its non-test files) whose names start with prefix.
func constValues(t *testing.T, dir, prefix string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	out := map[string]string{}
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if !strings.HasPrefix(id.Name, prefix) || i >= len(vs.Values) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, err := strconv.Unquote(lit.Value)
						if err != nil {
							t.Fatal(err)
						}
						out[id.Name] = v
					}
				}
			}
		}
	}
	return out
}

// packageDoc returns the package comment of the non-test files of dir.
func packageDoc(t *testing.T, dir string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var doc strings.Builder
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			t.Fatal(err)
		}
		if f.Doc != nil {
			doc.WriteString(f.Doc.Text())
		}
	}
	return doc.String()
}

// The package doc names every outcome, store call and wait reason the
// middleware reports (the Outcome*, Op* and Wait* constants of package
// inboxmw, read from its source), so that a new one cannot go unlisted.
func TestPackageDoc_lists_every_outcome_op_and_wait_reason(t *testing.T) {
	t.Parallel()
	doc := packageDoc(t, ".")
	for _, c := range []struct {
		prefix string
		min    int
	}{{"Outcome", 13}, {"Op", 6}, {"Wait", 2}} {
		vals := constValues(t, filepath.Join("..", "middleware"), c.prefix)
		if len(vals) < c.min {
			t.Fatalf("found %d %s* constants in ../middleware (%v), want at least %d: is the parser still finding them?", len(vals), c.prefix, vals, c.min)
		}
		for name, v := range vals {
			if !regexp.MustCompile(`(^|[^a-z_])` + regexp.QuoteMeta(v) + `($|[^a-z_])`).MatchString(doc) {
				t.Errorf("the package doc does not list inboxmw.%s (%q)", name, v)
			}
		}
	}
}
