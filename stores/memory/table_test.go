package memory

import (
	"math/rand/v2"
	"testing"
)

// TestTable_against_a_map inserts and removes words at random in tables
// whose hashes crowd a few homes (long probe runs that wrap around the end),
// and checks after every step that each present word is found from its home
// before an empty word, and that the table holds exactly the model's words.
func TestTable_against_a_map(t *testing.T) {
	t.Parallel()
	for _, homes := range []uint32{1, 3, 64, 1 << 20} {
		r := rand.New(rand.NewPCG(uint64(homes), 7))
		var tb table
		model := map[uint64]bool{}
		var present []uint64
		for step := range 20000 {
			if len(present) > 0 && (r.IntN(3) == 0 || len(present) > 300) {
				k := r.IntN(len(present))
				x := present[k]
				present[k] = present[len(present)-1]
				present = present[:len(present)-1]
				delete(model, x)
				tb.remove(x)
			} else {
				// Homes near the end of the array, so that runs wrap.
				lo := ^uint32(0) - r.Uint32N(homes)
				x := word(uint64(lo), int32(step))
				model[x] = true
				present = append(present, x)
				tb.insert(x)
			}
			if step%97 == 0 || step < 2000 {
				checkTable(t, &tb, model)
			}
		}
		checkTable(t, &tb, model)
	}
}

func checkTable(t *testing.T, tb *table, model map[uint64]bool) {
	t.Helper()
	n := 0
	for _, x := range tb.w {
		if x == 0 {
			continue
		}
		n++
		if !model[x] {
			t.Fatalf("table holds %#x, which was removed or never inserted", x)
		}
	}
	if n != len(model) || tb.n != len(model) {
		t.Fatalf("table holds %d words (counts %d), want %d", n, tb.n, len(model))
	}
	m := tb.mask()
	for x := range model {
		found := false
		for p := tb.home(uint32(x >> 32)); tb.w[p] != 0; p = (p + 1) & m {
			if tb.w[p] == x {
				found = true
				break
			}
		}
		if !found {
			t.Fatalf("%#x is not reachable from its home", x)
		}
	}
}
