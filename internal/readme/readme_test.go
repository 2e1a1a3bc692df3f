package readme_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/watermill-inbox/inbox/internal/readme"
)

// Every fenced block of README.md and of docs/*.md is run by a test,
// compiled, or an excerpt of a compiled file that matches it (package
// readme's doc).
func TestREADME_every_block_is_held(t *testing.T) {
	t.Parallel()
	files, err := readme.Files(readme.Root(t))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(files, "README.md") || !slices.Contains(files, "docs/stores.md") {
		t.Fatalf("the files held to the code are %q: want README.md and the pages of docs/", files)
	}
	blocks := readme.Load(t)
	if len(blocks) < 10 {
		t.Fatalf("README.md and docs/ have %d fenced blocks: is the parser still finding them?", len(blocks))
	}
	for _, err := range readme.Check(readme.Root(t), blocks) {
		t.Error(err)
	}
}

// The checker itself, on a README and files of its own: each way a block
// can fail to be held fails, and held blocks pass.
func TestCheck_finds_every_block_not_held(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("pkg/x_test.go", "package x\n\nfunc TestReads(t *T) { _ = \"README.md\" }\n\nfunc TestBlind(t *T) {}\n")
	write("pkg/snip.go", "package x\n\nfunc f() {\n\ta := 1 // one\n\tif a > 0 {\n\t\treturn // early\n\t}\n\tb := a +  2\n}\n")
	md := "# T\n\n" +
		"```sh\necho unmarked\n```\n\n" + // 1: no marker
		"<!-- readme: run pkg TestReads -->\n```sh\necho ok\n```\n\n" + // 2: held
		"<!-- readme: run pkg TestBlind -->\n```sh\necho x\n```\n\n" + // 3: the test does not read the README
		"<!-- readme: run pkg TestMissing -->\n```sh\necho x\n```\n\n" + // 4: no such test
		"<!-- readme: excerpt pkg/snip.go -->\n```go\na := 1   // one\nif a > 0 { ... } // early\nb := a + 2\n```\n\n" + // 5: held, comments included
		"<!-- readme: excerpt pkg/snip.go -->\n```go\nb := a + 2\na := 1\n```\n\n" + // 6: out of order
		"<!-- readme: excerpt pkg/snip.go -->\n```go\na := 2\n```\n\n" + // 7: a line the file lacks
		"  <!-- readme: excerpt pkg/notes.txt -->\n  ```go\n  a := 1\n  ```\n\n" + // 8: not a Go file
		"<!-- readme: excerpt pkg/snip.go -->\n```go\na := 1 // one, said otherwise\n```\n\n" + // 9: a comment the file lacks
		"<!-- readme: excerpt pkg/snip.go -->\n```go\na := 1\n```\n\n" + // 10: a line without the file's comment
		"<!-- readme: excerpt pkg/snip.go -->\n```go\na := 1 // one\nif a > 0 { ... } // late\n```\n" // 11: an elided line's comment the file lacks
	blocks, err := readme.Parse([]byte(md))
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 11 || blocks[7].Text != "a := 1" || blocks[7].Lang != "go" {
		t.Fatalf("parsed %d blocks, the last %+v", len(blocks), blocks[len(blocks)-1])
	}
	errs := readme.Check(root, blocks)
	failed := map[int]string{}
	for _, err := range errs {
		m := regexp.MustCompile(`^README\.md:(\d+)`).FindStringSubmatch(err.Error())
		if m == nil {
			t.Fatalf("error %q does not name its line", err)
		}
		for i, b := range blocks {
			if m[1] == strconv.Itoa(b.Line) {
				failed[i+1] = err.Error()
			}
		}
	}
	want := map[int]string{
		1:  "no <!-- readme: ... --> marker",
		3:  "TestBlind does not read README.md",
		4:  "no func TestMissing in pkg/*_test.go",
		6:  `pkg/snip.go has no line "a := 1" after the block's previous lines`,
		7:  `pkg/snip.go has no line "a := 2"`,
		8:  "pkg/notes.txt is not a Go file",
		9:  `pkg/snip.go has no line "a := 1 // one, said otherwise"`,
		10: `pkg/snip.go has no line "a := 1"`,
		11: `pkg/snip.go has no line with the comment "// late"`,
	}
	for i := 1; i <= len(blocks); i++ {
		switch {
		case want[i] == "" && failed[i] != "":
			t.Errorf("block %d is held, yet: %s", i, failed[i])
		case want[i] != "" && !strings.Contains(failed[i], want[i]):
			t.Errorf("block %d: error %q, want one saying %q", i, failed[i], want[i])
		}
	}

	for _, bad := range []string{"<!-- readme: runs pkg T -->\n```\n```\n", "<!-- readme: run pkg -->\n```\n```\n", "```go\nunclosed\n"} {
		if _, err := readme.Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) succeeded", bad)
		}
	}
}

// An error names the file that holds the block: the README or a page of
// docs/.
func TestCheck_names_the_file(t *testing.T) {
	t.Parallel()
	blocks, err := readme.Parse([]byte("# T\n\n```sh\necho unmarked\n```\n"))
	if err != nil {
		t.Fatal(err)
	}
	blocks[0].File = "docs/page.md"
	if errs := readme.Check(t.TempDir(), blocks); len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), "docs/page.md:3 ") {
		t.Fatalf("Check of an unmarked block of docs/page.md: %v, want one error naming docs/page.md:3", errs)
	}
}

// A compile block builds as a main package of the module, and one that
// does not build fails (a real `go build`).
func TestCheck_compile(t *testing.T) {
	t.Parallel()
	root := readme.Root(t)
	blocks, err := readme.Parse([]byte("<!-- readme: compile -->\n```go\nimport \"github.com/watermill-inbox/inbox\"\n\nvar _ = inbox.NewLeaseID\n```\n\n" +
		"<!-- readme: compile -->\n```go\nvar _ = inbox.NoSuchThing\n```\n"))
	if err != nil {
		t.Fatal(err)
	}
	errs := readme.Check(root, blocks)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "README.md:9") || !strings.Contains(errs[0].Error(), "does not compile") {
		t.Fatalf("Check of a good and a bad compile block: %v, want one error, for the second", errs)
	}
}

// The install command of README's "Quick start", run as written in a new
// module of its own: the module is this repository (a replace directive,
// as it is not fetched from a proxy here), found at @latest.
func TestREADME_install_command(t *testing.T) {
	t.Parallel()
	blocks := readme.RunBy(t)
	if len(blocks) != 1 || len(blocks[0].Lines()) != 1 {
		t.Fatalf("want one block of one command, got %+v", blocks)
	}
	line := blocks[0].Lines()[0]
	root := readme.Root(t)
	dir := t.TempDir()
	mod := "module example.com/app\n\ngo 1.24\n\nreplace github.com/watermill-inbox/inbox => " + root + "\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-ec", line)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
	got, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^require github\.com/watermill-inbox/inbox v`).Match(got) {
		t.Fatalf("after %s, go.mod does not require the module:\n%s", line, got)
	}
}

// The README's make commands name targets of the Makefile: each runs with
// make -n (printing what it would do, not doing it: make test inside a
// test would run every test again). What make fuzz is said to fuzz is
// what it fuzzes: every fuzz target of the library's module, each for
// FUZZTIME.
func TestREADME_make_targets(t *testing.T) {
	t.Parallel()
	root := readme.Root(t)
	n := 0
	for _, b := range readme.RunBy(t) {
		for _, line := range b.Lines() {
			cmdline, what, _ := strings.Cut(line, "#")
			f := strings.Fields(cmdline)
			if len(f) != 2 || f[0] != "make" {
				t.Fatalf("README line %q is not `make TARGET  # what it does`", line)
			}
			cmd := exec.Command("make", "-n", f[1])
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("make -n %s: %v\n%s", f[1], err, out)
			}
			if f[1] == "fuzz" {
				checkFuzzLine(t, root, what)
			}
			n++
		}
	}
	if n == 0 {
		t.Fatal("no make command in the block")
	}
}

// checkFuzzLine wants what, the README's words on make fuzz, to give the
// number of fuzz targets that make fuzz runs (those of the packages of the
// root module, go list ./...) and the Makefile's FUZZTIME.
func checkFuzzLine(t *testing.T, root, what string) {
	t.Helper()
	targets := 0
	fuzzRE := regexp.MustCompile(`(?m)^func Fuzz\w*\(`)
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (strings.HasPrefix(d.Name(), ".") || fileExists(filepath.Join(p, "go.mod"))) {
				return filepath.SkipDir // another module, which make fuzz does not list
			}
			return nil
		}
		if strings.HasSuffix(p, "_test.go") {
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			targets += len(fuzzRE.FindAll(src, -1))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^FUZZTIME\s*\?=\s*(\S+)`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("the Makefile sets no FUZZTIME")
	}
	if want := fmt.Sprintf("%d fuzz targets", targets); !strings.Contains(what, want) || !strings.Contains(what, string(m[1])+" each") {
		t.Errorf("README's make fuzz says %q; make fuzz runs %s, %s each: say so", strings.TrimSpace(what), want, m[1])
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// README.md is read in ten minutes (issue 30: it was 785 lines, one table
// row 1,181 characters long): at most 300 lines, none of them, prose,
// table row or code, over 200 characters. Depth goes to docs/ and the
// package docs. BENCHMARKS.md is a user's page, not a lab notebook (issue
// 44: it was 3,398 lines): at most 300 lines too; its generated targets
// table has rows longer than 200 characters, so its width is not bounded.
func TestREADME_size(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name               string
		maxLines, maxWidth int
	}{
		{"README.md", 300, 200},
		{"BENCHMARKS.md", 300, 0},
	} {
		b, err := os.ReadFile(filepath.Join(readme.Root(t), c.name))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		if len(lines) > c.maxLines {
			t.Errorf("%s has %d lines, more than %d: move depth to a page of docs/, history to git", c.name, len(lines), c.maxLines)
		}
		for i, l := range lines {
			if n := utf8.RuneCountInString(l); c.maxWidth > 0 && n > c.maxWidth {
				t.Errorf("%s:%d is %d characters long, more than %d: %.60q...", c.name, i+1, n, c.maxWidth, l)
			}
		}
	}
}
