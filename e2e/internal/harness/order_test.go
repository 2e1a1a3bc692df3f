package harness

import (
	"slices"
	"strings"
	"testing"
)

// ledgerOf is an order ledger where every account applies its events once,
// in order, by process 1, with edit changing account 0's lines.
func ledgerOf(edit func(acct0 []string) []string) []string {
	var lines, acct0 []string
	for ev := range orderEvents {
		for a := range orderAccounts {
			l := orderID(a, ev) + " 1"
			if a == 0 {
				acct0 = append(acct0, l)
				continue
			}
			lines = append(lines, l)
		}
	}
	return append(lines, edit(acct0)...)
}

func TestCheckOrder_finds_violations_losses_and_doubles(t *testing.T) {
	t.Parallel()
	killed := map[string]bool{"9": true}
	for _, c := range []struct {
		name                               string
		edit                               func([]string) []string
		violations, lost, doubles, outside int
	}{
		{"in order", func(l []string) []string { return l }, 0, 0, 0, 0},
		{"two swapped", func(l []string) []string { l[2], l[3] = l[3], l[2]; return l }, 1, 0, 0, 0},
		{"one lost", func(l []string) []string { return slices.Delete(l, 4, 5) }, 0, 1, 0, 0},
		{"the killed process's event again at once", func(l []string) []string {
			l[3] = strings.Replace(l[3], " 1", " 9", 1)
			return slices.Insert(l, 4, orderID(0, 3)+" 2")
		}, 0, 0, 1, 0},
		{"a living process's event again at once", func(l []string) []string { return slices.Insert(l, 4, orderID(0, 3)+" 2") }, 0, 0, 0, 1},
		{"the killed process's event again after a later one", func(l []string) []string {
			l[3] = strings.Replace(l[3], " 1", " 9", 1)
			return slices.Insert(l, 5, orderID(0, 3)+" 2")
		}, 1, 0, 0, 0},
		{"three times", func(l []string) []string {
			l[3] = strings.Replace(l[3], " 1", " 9", 1)
			return slices.Insert(l, 4, orderID(0, 3)+" 2", orderID(0, 3)+" 2")
		}, 0, 0, 1, 1},
	} {
		rep, err := checkOrder(ledgerOf(c.edit), killed)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(rep.violations) != c.violations || len(rep.lost) != c.lost || len(rep.doubles) != c.doubles || len(rep.outside) != c.outside {
			t.Errorf("%s: %d violations %v, %d lost %v, %d doubles %v, %d outside %v; want %d, %d, %d, %d",
				c.name, len(rep.violations), rep.violations, len(rep.lost), rep.lost, len(rep.doubles), rep.doubles, len(rep.outside), rep.outside,
				c.violations, c.lost, c.doubles, c.outside)
		}
		if found := c.violations+c.lost+c.doubles+c.outside > 0; found != strings.Contains(rep.sequences, orderAccount(0)+":") || strings.Contains(rep.sequences, orderAccount(1)+":") {
			t.Errorf("%s: sequences %q", c.name, rep.sequences)
		}
	}
	if _, err := checkOrder([]string{"o-a00-e0"}, killed); err == nil {
		t.Error("a line without a process id passed")
	}
	if _, err := checkOrder([]string{"o-a99-e0 1"}, killed); err == nil {
		t.Error("a line of an unknown account passed")
	}
}
