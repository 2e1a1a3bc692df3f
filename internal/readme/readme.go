// Package readme keeps the code blocks of README.md and of the pages of
// docs/ true: every fenced block says, in an HTML comment on the line just
// before its opening fence, how a test holds it to the code
// (CONTRIBUTING.md, "README code blocks"):
//
//	<!-- readme: run DIR TEST -->    the test TEST, in package directory DIR,
//	                                 runs the block (its commands, its program)
//	                                 and compares what it prints with the
//	                                 block's; it gets the block with [RunBy]
//	<!-- readme: compile -->         a Go block that is a whole file: compiled
//	                                 as a main package of the module
//	<!-- readme: excerpt FILE -->    the block's lines are lines of FILE, a Go
//	                                 file of the repository (so compiled), in
//	                                 the same order, comments included; a line
//	                                 whose code holds "..." stands for elided
//	                                 code, and only its comment is looked for
//
// Several directives are separated by ';' (a block of two commands run by
// two tests). The package's own test, TestREADME_every_block_is_held, fails
// on a block without a directive, a run whose test does not exist or does
// not read the README, a compile that does not build, and an excerpt with a
// line its file lacks. The Go snippets that README excerpts show are
// functions of snippets_test.go, which TestSnippets_run runs.
package readme

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Block is one fenced code block of the README or of a page of docs/.
type Block struct {
	// File is the Markdown file that holds the block, relative to the
	// repository's root ("README.md", "docs/stores.md"); "" is README.md.
	File string
	// Line is the line number of the opening fence, from 1.
	Line int
	// Lang is the word after the opening fence ("go", "sh"), "" for none.
	Lang string
	// Text is what the fences enclose, without the fences' indentation
	// (blocks inside list items are indented), without a final newline.
	Text string
	// Directives are those of the marker comment before the fence.
	Directives []Directive
}

// Lines returns the block's lines.
func (b Block) Lines() []string { return strings.Split(b.Text, "\n") }

// Directive is one directive of a block's marker comment.
type Directive struct {
	// Kind is "run", "compile" or "excerpt".
	Kind string
	// Args are the kind's arguments: DIR and TEST for run, FILE for
	// excerpt, none for compile.
	Args []string
}

func (d Directive) String() string { return strings.Join(append([]string{d.Kind}, d.Args...), " ") }

var (
	fenceRE  = regexp.MustCompile("^( *)```([a-z]*)$")
	markerRE = regexp.MustCompile(`^\s*<!-- readme: (.*) -->$`)
)

// Parse returns the fenced blocks of a Markdown text. A marker comment
// that is malformed is an error, as is a fence that is not closed.
func Parse(src []byte) ([]Block, error) {
	lines := strings.Split(string(src), "\n")
	var blocks []Block
	for i := 0; i < len(lines); i++ {
		m := fenceRE.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		b := Block{Line: i + 1, Lang: m[2]}
		if i > 0 {
			if mm := markerRE.FindStringSubmatch(lines[i-1]); mm != nil {
				ds, err := parseDirectives(mm[1])
				if err != nil {
					return nil, fmt.Errorf("line %d: %w", i, err)
				}
				b.Directives = ds
			}
		}
		indent := m[1]
		var body []string
		for i++; ; i++ {
			if i == len(lines) {
				return nil, fmt.Errorf("line %d: the block is not closed", b.Line)
			}
			if lines[i] == indent+"```" {
				break
			}
			body = append(body, strings.TrimPrefix(lines[i], indent))
		}
		b.Text = strings.Join(body, "\n")
		blocks = append(blocks, b)
	}
	return blocks, nil
}

func parseDirectives(s string) ([]Directive, error) {
	var out []Directive
	for _, part := range strings.Split(s, ";") {
		f := strings.Fields(part)
		if len(f) == 0 {
			return nil, fmt.Errorf("empty directive in %q", s)
		}
		d := Directive{Kind: f[0], Args: f[1:]}
		want := map[string]int{"run": 2, "compile": 0, "excerpt": 1}
		n, ok := want[d.Kind]
		if !ok {
			return nil, fmt.Errorf("unknown directive %q in %q: want run DIR TEST, compile or excerpt FILE", d.Kind, s)
		}
		if len(d.Args) != n {
			return nil, fmt.Errorf("directive %q takes %d argument(s), got %q", d.Kind, n, d.Args)
		}
		out = append(out, d)
	}
	return out, nil
}

// Root returns the repository's root: the nearest directory above the
// working directory that holds README.md and a go.mod.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		_, errR := os.Stat(filepath.Join(dir, "README.md"))
		_, errM := os.Stat(filepath.Join(dir, "go.mod"))
		if errR == nil && errM == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("readme: no directory above the working directory holds README.md and go.mod")
		}
		dir = up
	}
}

// Files returns the Markdown files whose blocks are held to the code:
// README.md and the pages of docs/, relative to root.
func Files(root string) ([]string, error) {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	files := []string{"README.md"}
	for _, d := range docs {
		files = append(files, filepath.ToSlash(must(filepath.Rel(root, d))))
	}
	return files, nil
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// Load returns the blocks of the repository's README.md and docs/*.md.
func Load(t testing.TB) []Block {
	t.Helper()
	root := Root(t)
	files, err := Files(root)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []Block
	for _, f := range files {
		src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		bs, err := Parse(src)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for i := range bs {
			bs[i].File = f
		}
		blocks = append(blocks, bs...)
	}
	return blocks
}

// RunBy returns the blocks of the README and docs/ whose marker says that
// the calling test (t.Name(), its top-level test) runs them, and fails the
// test when there is none: a test that no block names runs nothing.
func RunBy(t testing.TB) []Block {
	t.Helper()
	name, _, _ := strings.Cut(t.Name(), "/")
	var out []Block
	for _, b := range Load(t) {
		for _, d := range b.Directives {
			if d.Kind == "run" && d.Args[1] == name {
				out = append(out, b)
				break
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("no block of README.md or docs/*.md is marked <!-- readme: run DIR %s -->", name)
	}
	return out
}

// Check reports every block of blocks that is not held to the code: no
// directive, or one that fails. root is the repository's root, which the
// directives' paths are relative to.
func Check(root string, blocks []Block) []error {
	var errs []error
	for _, b := range blocks {
		file := b.File
		if file == "" {
			file = "README.md"
		}
		where := fmt.Sprintf("%s:%d (```%s)", file, b.Line, b.Lang)
		if len(b.Directives) == 0 {
			errs = append(errs, fmt.Errorf("%s: no <!-- readme: ... --> marker on the line before the block: "+
				"say which test runs it (run DIR TEST), or compile it (compile), or name the Go file it is an excerpt of (excerpt FILE); see CONTRIBUTING.md", where))
			continue
		}
		for _, d := range b.Directives {
			var err error
			switch d.Kind {
			case "run":
				err = checkRun(root, d.Args[0], d.Args[1])
			case "compile":
				err = checkCompile(root, b)
			case "excerpt":
				err = checkExcerpt(root, d.Args[0], b)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %s: %w", where, d, err))
			}
		}
	}
	return errs
}

// checkRun wants the test function name in a _test.go file of dir, and its
// body to read the README (RunBy, or README.md by name).
func checkRun(root, dir, name string) error {
	files, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(dir), "*_test.go"))
	if err != nil {
		return err
	}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			return err
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || fn.Name.Name != name {
				continue
			}
			body := string(src[fset.Position(fn.Pos()).Offset:fset.Position(fn.End()).Offset])
			if !strings.Contains(body, "README") && !strings.Contains(body, "readme.RunBy(") {
				return fmt.Errorf("%s does not read README.md (call readme.RunBy(t))", name)
			}
			return nil
		}
	}
	return fmt.Errorf("no func %s in %s/*_test.go", name, dir)
}

// checkCompile builds the block as the main package of a directory of the
// module that exists only in an overlay, so it has the module's
// dependencies. "package main" is added, and an empty main when the block
// has none.
func checkCompile(root string, b Block) error {
	if b.Lang != "go" {
		return errors.New("only a go block compiles")
	}
	src := "package main\n\n" + b.Text + "\n"
	if !regexp.MustCompile(`(?m)^func main\(\)`).MatchString(b.Text) {
		src += "\nfunc main() {}\n"
	}
	tmp, err := os.MkdirTemp("", "readme-compile-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	file := filepath.Join(tmp, "main.go")
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		return err
	}
	virtual := filepath.Join(root, fmt.Sprintf("readme_block_%d", b.Line), "main.go")
	ov, err := json.Marshal(map[string]map[string]string{"Replace": {virtual: file}})
	if err != nil {
		return err
	}
	overlay := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(overlay, ov, 0o600); err != nil {
		return err
	}
	cmd := exec.Command("go", "build", "-overlay", overlay, "-o", os.DevNull, "./"+filepath.Base(filepath.Dir(virtual)))
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("does not compile: %v\n%s", err, out)
	}
	return nil
}

// checkExcerpt wants each line of b, compared with runs of white space
// made one, among the lines of file, in the same order, comments included.
// Blank lines are not compared. A line whose code (before its comment)
// holds "..." stands for elided code, any number of lines: only its
// comment, if it has one, must be on a line of file after the block's
// previous lines (and the next lines come after that one).
func checkExcerpt(root, file string, b Block) error {
	if !strings.HasSuffix(file, ".go") {
		return fmt.Errorf("%s is not a Go file: an excerpt is of a file that is compiled", file)
	}
	src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
	if err != nil {
		return err
	}
	var have []string
	for _, l := range strings.Split(string(src), "\n") {
		have = append(have, squash(l))
	}
	next, compared := 0, 0
	find := func(match func(string) bool) bool {
		for ; next < len(have); next++ {
			if match(have[next]) {
				next++
				return true
			}
		}
		return false
	}
	for _, l := range b.Lines() {
		want := squash(l)
		if want == "" {
			continue
		}
		if c := code(l); strings.Contains(c, "...") {
			comment := squash(strings.TrimPrefix(strings.TrimSpace(l), strings.TrimSpace(c)))
			if comment != "" && !find(func(h string) bool { return strings.HasSuffix(h, comment) }) {
				return fmt.Errorf("%s has no line with the comment %q of the block's elided line %q after the block's previous lines (the block and the file differ: change one)", file, comment, want)
			}
			continue
		}
		compared++
		if !find(func(h string) bool { return h == want }) {
			return fmt.Errorf("%s has no line %q after the block's previous lines (the block and the file differ: change one)", file, want)
		}
	}
	if compared == 0 {
		return errors.New("the block has no line of code to compare")
	}
	return nil
}

// squash returns line with runs of white space made one space, trimmed.
func squash(line string) string { return strings.Join(strings.Fields(line), " ") }

// code returns line without its comment and with runs of white space made
// one space, trimmed.
func code(line string) string {
	var s scanner.Scanner
	fset := token.NewFileSet()
	src := []byte(line)
	f := fset.AddFile("", fset.Base(), len(src))
	s.Init(f, src, func(token.Position, string) {}, scanner.ScanComments)
	cut := len(src)
	for {
		pos, tok, _ := s.Scan()
		if tok == token.EOF {
			break
		}
		if tok == token.COMMENT {
			cut = f.Offset(pos)
			break
		}
	}
	return strings.Join(strings.Fields(string(bytes.TrimSpace(src[:cut]))), " ")
}

// ShellWords splits a command line of plain words and single-quoted
// strings, as the docs write them.
func ShellWords(t testing.TB, line string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	inWord, quoted := false, false
	for _, c := range line {
		switch {
		case quoted && c == '\'':
			quoted = false
		case quoted:
			w.WriteRune(c)
		case c == '\'':
			quoted, inWord = true, true
		case c == ' ':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case strings.ContainsRune(`"$\|&;<>()*?`+"`", c):
			t.Fatalf("line %q: the test's splitter takes plain words and single quotes only", line)
		default:
			w.WriteRune(c)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("line %q: unterminated quote", line)
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}
