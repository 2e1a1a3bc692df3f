package readme_test

import (
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/watermill-inbox/inbox/internal/readme"
)

// mdLink matches an inline Markdown link or image: [text](target) or
// [text](target "title").
var mdLink = regexp.MustCompile(`\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)

// Every relative link of README.md, CONTRIBUTING.md, BENCHMARKS.md and the
// pages of docs/ names a file of the repository, and an anchor (#...) names
// a heading of the page it points to, as GitHub makes the anchors.
func TestMarkdown_relative_links_resolve(t *testing.T) {
	t.Parallel()
	root := readme.Root(t)
	files, err := readme.Files(root)
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "CONTRIBUTING.md", "BENCHMARKS.md")
	anchors := map[string]map[string]bool{} // page -> its anchors
	anchorsOf := func(page string) (map[string]bool, error) {
		if a, ok := anchors[page]; ok {
			return a, nil
		}
		src, err := os.ReadFile(root + "/" + page)
		if err != nil {
			return nil, err
		}
		anchors[page] = headingAnchors(string(src))
		return anchors[page], nil
	}
	links := 0
	for _, f := range files {
		src, err := os.ReadFile(root + "/" + f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(outsideFences(string(src)), "\n") {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				file, anchor, _ := strings.Cut(target, "#")
				page := f
				if file != "" {
					page = path.Clean(path.Join(path.Dir(f), file))
					if _, err := os.Stat(root + "/" + page); err != nil {
						t.Errorf("%s:%d: link %q: no file %s in the repository", f, i+1, target, page)
						continue
					}
				}
				if anchor == "" || !strings.HasSuffix(page, ".md") {
					continue
				}
				a, err := anchorsOf(page)
				if err != nil {
					t.Fatal(err)
				}
				if !a[anchor] {
					t.Errorf("%s:%d: link %q: %s has no heading whose anchor is #%s", f, i+1, target, page, anchor)
				}
			}
		}
	}
	if links < 20 {
		t.Fatalf("found %d relative links: is the pattern still finding them?", links)
	}
}

// outsideFences blanks the lines of fenced blocks, keeping the line count.
func outsideFences(src string) string {
	lines := strings.Split(src, "\n")
	in := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// headingAnchors returns the anchors GitHub gives the headings of a page:
// lower case, every character but letters, marks, digits, '-', '_' and
// spaces dropped, spaces turned into '-', and "-1", "-2", ... after a repeated one.
func headingAnchors(src string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, l := range strings.Split(outsideFences(src), "\n") {
		if !strings.HasPrefix(l, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsNumber(r) || unicode.Is(unicode.Pc, r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

func TestHeadingAnchors(t *testing.T) {
	t.Parallel()
	got := headingAnchors("# Benchmarks\n## Issue 29: every message at the floor's cost\n```\n# not a heading\n```\n### `make bench` twice\n### `make bench` twice\n## Targets of issues 14, 21 and 24\n")
	for _, want := range []string{"benchmarks", "issue-29-every-message-at-the-floors-cost", "make-bench-twice", "make-bench-twice-1", "targets-of-issues-14-21-and-24"} {
		if !got[want] {
			t.Errorf("no anchor %q in %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Errorf("a line of a fenced block was taken for a heading: %v", got)
	}
}
