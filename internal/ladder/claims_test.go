package ladder_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox/internal/ladder"
)

// worstFactor is the supremum of rung/wait over the waits from the first
// rung to the top one: a wait just over a rung takes the next one, so the
// widest step between two rungs decides it.
func worstFactor(rungs []time.Duration) float64 {
	worst := 1.0
	for i := 1; i < len(rungs); i++ {
		worst = max(worst, float64(rungs[i])/float64(rungs[i-1]))
	}
	return worst
}

// boundRE finds a statement of how much longer than its wait a copy may
// wait on the ladder: "less than 2.5 times", "at most about twice", ...
var boundRE = regexp.MustCompile(`(?i)\b(at most|less than)(?: about)? (twice|[0-9]+(?:\.[0-9]+)? times)\b`)

// Every place that states how much longer than its wait a copy waits on
// the default ladder states the ladder's true bound: less than its widest
// step (issue 30: "at most about twice" the backoff, where the step from
// 2 s to 5 s is 2.5 times). The places are the packages that use the
// ladder, this one, and the README.
func TestDefault_bound_stated_is_the_ladders(t *testing.T) {
	t.Parallel()
	worst := worstFactor(ladder.Default)
	// A wait over a rung takes the next rung, strictly less than worst
	// times the wait; a wait just over the widest step's lower rung comes
	// as close to it as one likes.
	for i := 1; i < len(ladder.Default); i++ {
		lo, hi := ladder.Default[i-1], ladder.Default[i]
		for _, d := range []time.Duration{lo + time.Millisecond, (lo + hi) / 2, hi} {
			got := ladder.Default[ladder.Round(ladder.Default, d)]
			if got < d || float64(got) >= worst*float64(d) {
				t.Fatalf("a wait of %s takes the rung %s: not in [wait, %g × wait)", d, got, worst)
			}
		}
	}
	root := filepath.Join("..", "..")
	var files []string
	for _, pat := range []string{"README.md", "docs/*.md", "amqp/*.go", "kafka/*.go", "internal/ladder/*.go"} {
		m, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(pat)))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	stated := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := prose(string(src))
		for _, m := range boundRE.FindAllStringSubmatchIndex(text, -1) {
			phrase := text[m[0]:m[1]]
			window := text[max(0, m[0]-300):min(len(text), m[1]+100)]
			if !regexp.MustCompile(`(?i)ladder|delay|rung|copy`).MatchString(window) {
				continue // not about the ladder
			}
			stated++
			factor := 2.0
			if n := text[m[4]:m[5]]; n != "twice" {
				factor, _ = strconv.ParseFloat(strings.Fields(n)[0], 64)
			}
			if factor != worst {
				t.Errorf("%s: %q: the default ladder makes a copy wait up to %g times its wait (its widest step)", f, phrase, worst)
			}
		}
	}
	if stated == 0 {
		t.Fatal("no file states the default ladder's bound; ladder.Default's doc must")
	}
}

// prose returns src as one line of words: Go comment markers and line
// breaks removed, so a sentence split over lines is found whole.
func prose(src string) string {
	var b strings.Builder
	for _, l := range strings.Split(src, "\n") {
		l = strings.TrimSpace(l)
		l = strings.TrimPrefix(l, "//")
		b.WriteString(strings.TrimSpace(l))
		b.WriteByte(' ')
	}
	return strings.Join(strings.Fields(b.String()), " ")
}
