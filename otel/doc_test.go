package inboxotel_test

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// parseDir parses the non-test Go files of dir.
func parseDir(t *testing.T, dir string, mode parser.Mode) []*ast.File {
	return parseDirIn(t, token.NewFileSet(), dir, mode)
}

func parseDirIn(t *testing.T, fset *token.FileSet, dir string, mode parser.Mode) []*ast.File {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, mode)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// middlewareConsts returns the string constants of package inboxmw (its
// non-test files) that the middleware reports to a Tracer: those of type
// Outcome, and the store operations (Op...), each a step and so a span.
func middlewareConsts(t *testing.T) (outcomes, ops map[string]string) {
	t.Helper()
	outcomes, ops = map[string]string{}, map[string]string{}
	for _, f := range parseDir(t, "../middleware", 0) {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				typ, _ := vs.Type.(*ast.Ident)
				for i, id := range vs.Names {
					if i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					switch {
					case typ != nil && typ.Name == "Outcome":
						outcomes[id.Name] = v
					case strings.HasPrefix(id.Name, "Op"):
						ops[id.Name] = v
					}
				}
			}
		}
	}
	if len(outcomes) < 10 || len(ops) < 5 {
		t.Fatalf("found %d outcomes and %d ops in package inboxmw: is the parser still finding them?", len(outcomes), len(ops))
	}
	return outcomes, ops
}

// The package doc names every span the middleware's steps make (inbox.claim
// and inbox.<op> for each store operation and the hand-off to Redelivery)
// and every outcome it can report, derived from package inboxmw's
// constants (issue 30: the doc left out inbox.redeliver, redelivered and
// stale).
func TestDoc_names_every_span_and_outcome(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	p, err := doc.NewFromFiles(fset, parseDirIn(t, fset, ".", parser.ParseComments), "github.com/watermill-inbox/inbox/otel")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(p.Doc), " ")
	word := func(w string) bool {
		return regexp.MustCompile(`(^|[^a-z_.])` + regexp.QuoteMeta(w) + `($|[^a-z_])`).MatchString(text)
	}
	outcomes, ops := middlewareConsts(t)
	spans := []string{"inbox.claim"}
	for _, op := range ops {
		spans = append(spans, "inbox."+op)
	}
	for _, s := range spans {
		if !word(s) {
			t.Errorf("the package doc does not name the span %s", s)
		}
	}
	for name, o := range outcomes {
		if !word(o) {
			t.Errorf("the package doc does not name the outcome %s (inboxmw.%s)", o, name)
		}
	}
}
