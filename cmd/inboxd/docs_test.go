package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/watermill-inbox/inbox/internal/readme"
)

// The blocks of docs/inboxd.md: its start is the README's, line for line,
// which TestREADME_inboxd_command_serves runs as written; its token file
// of tenants is one that inboxd reads, each token with its prefixes.
func TestDocs_inboxd_blocks(t *testing.T) {
	t.Parallel()
	var start, tokens *readme.Block
	for _, b := range readme.RunBy(t) {
		switch {
		case b.File != "docs/inboxd.md":
			t.Fatalf("%s:%d is marked for this test, which runs docs/inboxd.md's blocks", b.File, b.Line)
		case b.Lang == "sh":
			start = &b
		default:
			tokens = &b
		}
	}
	if start == nil || tokens == nil {
		t.Fatal("docs/inboxd.md marks no sh block (the start) or no token file block for this test")
	}

	var readmeStart []string
	for _, b := range readme.Load(t) {
		for _, d := range b.Directives {
			if b.File == "README.md" && d.Kind == "run" && d.Args[1] == "TestREADME_inboxd_command_serves" && b.Lang == "sh" {
				readmeStart = b.Lines()
			}
		}
	}
	if readmeStart == nil || !slices.Equal(start.Lines(), readmeStart) {
		t.Errorf("docs/inboxd.md's start:\n%s\nis not the README's, which TestREADME_inboxd_command_serves runs:\n%s", start.Text, strings.Join(readmeStart, "\n"))
	}

	file := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(file, []byte(tokens.Text+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := parse(nil, env(map[string]string{"INBOX_TOKEN_FILE": file}))
	if err != nil {
		t.Fatalf("inboxd refuses docs/inboxd.md's token file: %v", err)
	}
	lines := tokens.Lines()
	if len(s.grants) != len(lines) {
		t.Fatalf("inboxd read %d tokens from the docs' %d lines", len(s.grants), len(lines))
	}
	for i, g := range s.grants {
		f := strings.Fields(lines[i])
		var want []string
		for _, p := range f[1:] {
			want = append(want, strings.TrimPrefix(p, "prefix="))
		}
		if g.Token != f[0] || !slices.Equal(g.Prefixes, want) {
			t.Errorf("line %d of the docs' token file: inboxd read the token with prefixes %q, want %q", i+1, g.Prefixes, want)
		}
	}
}
