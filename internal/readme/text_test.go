package readme_test

import (
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/watermill-inbox/inbox/internal/readme"
)

// repoFiles walks the repository from root, every module included, and
// returns the paths (relative, with slashes) of the files whose name ends
// with one of exts. It skips version control, dependencies fetched into
// the tree (vendor, node_modules) and build output.
func repoFiles(t *testing.T, root string, exts ...string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "vendor", "node_modules", "bin":
				return filepath.SkipDir
			}
			return nil
		}
		for _, e := range exts {
			if strings.HasSuffix(p, e) {
				rel, err := filepath.Rel(root, p)
				if err != nil {
					return err
				}
				out = append(out, filepath.ToSlash(rel))
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A comment and the line of the file it starts on.
type comment struct {
	line int
	text string
}

// goComments returns the comments of a Go source file.
func goComments(t *testing.T, path string) []comment {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var s scanner.Scanner
	s.Init(fset.AddFile(path, -1, len(src)), src, nil, scanner.ScanComments)
	var out []comment
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			return out
		}
		if tok == token.COMMENT {
			out = append(out, comment{fset.Position(pos).Line, lit})
		}
	}
}

// mdName matches a name of a Markdown file: a path or a bare name ending
// in .md.
var mdName = regexp.MustCompile(`[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md\b`)

// mdNames returns the Markdown files that text names, leaving out those
// inside a URL (another site's files).
func mdNames(text string) []string {
	var out []string
	for _, word := range strings.Fields(text) {
		if strings.Contains(word, "://") {
			continue
		}
		out = append(out, mdName.FindAllString(word, -1)...)
	}
	return out
}

// held tells whether the repository holds the Markdown file that name
// names, from a file in dir: as a path from dir or from the root, or, for
// a name whose directory is left out or relative to some other
// directory, as the tail of the path of one of the repository's files.
func held(name, dir string, mds map[string]bool) bool {
	if mds[filepath.ToSlash(filepath.Join(dir, name))] || mds[filepath.ToSlash(filepath.Clean(name))] {
		return true
	}
	tail := name
	for strings.HasPrefix(tail, "../") || strings.HasPrefix(tail, "./") {
		tail = tail[strings.Index(tail, "/")+1:]
	}
	for p := range mds {
		if p == tail || strings.HasSuffix(p, "/"+tail) {
			return true
		}
	}
	return false
}

// TestText_names_only_markdown_files_the_repository_holds: a comment of a
// Go file, or a Markdown file, of any module of the repository that names
// a .md file names one the repository holds, so that a reader sent there
// finds it.
func TestText_names_only_markdown_files_the_repository_holds(t *testing.T) {
	t.Parallel()
	root := readme.Root(t)
	mdFiles := repoFiles(t, root, ".md")
	mds := map[string]bool{}
	for _, p := range mdFiles {
		mds[p] = true
	}
	named := 0
	check := func(file string, line int, text string) {
		for _, name := range mdNames(text) {
			named++
			if !held(name, filepath.ToSlash(filepath.Dir(file)), mds) {
				t.Errorf("%s:%d: names %s, which the repository does not hold", file, line, name)
			}
		}
	}
	for _, f := range repoFiles(t, root, ".go") {
		for _, c := range goComments(t, filepath.Join(root, f)) {
			for i, l := range strings.Split(c.text, "\n") {
				check(f, c.line+i, l)
			}
		}
	}
	for _, f := range mdFiles {
		src, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range strings.Split(string(src), "\n") {
			check(f, i+1, l)
		}
	}
	if named < 50 {
		t.Fatalf("found %d names of Markdown files: is the pattern still finding them?", named)
	}
}

// issueOrDate matches what dates a comment or ties it to an issue
// tracker: "issue 31", "issues 21, 24", "#29", "2026-11-28", "November
// 2026", "28 November".
var issueOrDate = regexp.MustCompile(`(?i)\bissues? #?\d+|(?:^|[\s(\[])#\d+\b|\b\d{4}-\d{2}-\d{2}\b|\b(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sept?(?:ember)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.? (?:\d{1,2},? )?\d{4}\b|\b\d{1,2} (?:january|february|march|april|may|june|july|august|september|october|november|december)\b`)

// TestText_no_issue_numbers_or_dates_in_code_comments: the comments of
// the non-test Go files of every module say what the code does and why,
// not which issue asked for it or when: that history is in git.
func TestText_no_issue_numbers_or_dates_in_code_comments(t *testing.T) {
	t.Parallel()
	root := readme.Root(t)
	files := 0
	for _, f := range repoFiles(t, root, ".go") {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		files++
		for _, c := range goComments(t, filepath.Join(root, f)) {
			for i, l := range strings.Split(c.text, "\n") {
				if m := issueOrDate.FindString(l); m != "" {
					t.Errorf("%s:%d: %q in a comment: %s", f, c.line+i, strings.TrimSpace(m), strings.TrimSpace(l))
				}
			}
		}
	}
	if files < 100 {
		t.Fatalf("found %d non-test Go files: is the walk still finding them?", files)
	}
}

// TestIssueOrDate checks the pattern on what it must and must not find.
func TestIssueOrDate(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"issue 31", "Issues 21, 24", "(see #29)", "#29 asked", "on 2026-11-28", "November 2026", "Nov 28, 2026", "28 November"} {
		if !issueOrDate.MatchString(s) {
			t.Errorf("issueOrDate misses %q", s)
		}
	}
	for _, s := range []string{"an issue of the store", "x#29", "RFC 3339", "version 2", "30 s", "HTTP 503", "mayday 2026"} {
		if issueOrDate.MatchString(s) {
			t.Errorf("issueOrDate finds %q", s)
		}
	}
}
