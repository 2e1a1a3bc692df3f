package driver_test

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/watermill-inbox/inbox/stores/driver"
)

func TestWaves(t *testing.T) {
	t.Parallel()
	ops := func(keys ...string) []driver.Op {
		o := make([]driver.Op, len(keys))
		for i, k := range keys {
			o[i] = driver.Op{Kind: driver.Claim, Key: k}
		}
		return o
	}
	for _, c := range []struct {
		keys []string
		want [][]int
	}{
		{nil, nil},
		{[]string{"a"}, [][]int{{0}}},
		{[]string{"a", "b", "c"}, [][]int{{0, 1, 2}}},
		{[]string{"a", "a"}, [][]int{{0}, {1}}},
		{[]string{"a", "b", "a", "c", "a", "b"}, [][]int{{0, 1, 3}, {2, 5}, {4}}},
	} {
		got := driver.Waves(ops(c.keys...))
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("Waves(%q) = %v, want %v", c.keys, got, c.want)
		}
	}
}

// Every op is in exactly one wave, a wave holds each key once, and the ops of
// one key are in successive waves in slice order.
func TestWaves_properties(t *testing.T) {
	t.Parallel()
	for n := 1; n <= 64; n++ {
		var ops []driver.Op
		for i := range n {
			ops = append(ops, driver.Op{Key: fmt.Sprint(i * 7 % (n/3 + 1))})
		}
		seen := make([]bool, n)
		last := map[string]int{} // key -> index of its op in the previous wave
		for w, wave := range driver.Waves(ops) {
			keys := map[string]bool{}
			for j, i := range wave {
				k := ops[i].Key
				if seen[i] || keys[k] || (j > 0 && wave[j-1] >= i) {
					t.Fatalf("n=%d wave %d: %v", n, w, wave)
				}
				seen[i], keys[k] = true, true
				if prev, ok := last[k]; (ok && prev >= i) || (!ok && w > 0 && firstOf(ops, k) != i) {
					t.Fatalf("n=%d: key %s out of order in wave %d", n, k, w)
				}
				last[k] = i
			}
		}
		for i, ok := range seen {
			if !ok {
				t.Fatalf("n=%d: op %d in no wave", n, i)
			}
		}
	}
}

func firstOf(ops []driver.Op, key string) int {
	for i, op := range ops {
		if op.Key == key {
			return i
		}
	}
	return -1
}
