package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/watermill-inbox/inbox/internal/readme"
)

// The token file of tenants in docs/inboxd.md is one that inboxd reads,
// each token with its prefixes. (Its start is run by
// TestDocs_inboxd_start_serves.)
func TestDocs_inboxd_blocks(t *testing.T) {
	t.Parallel()
	blocks := readme.RunBy(t)
	if len(blocks) != 1 || blocks[0].File != "docs/inboxd.md" {
		t.Fatalf("want one block of docs/inboxd.md, the token file, marked for this test; got %d", len(blocks))
	}
	tokens := blocks[0]
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
