package driver

// Waves splits ops into successive waves in which each key appears at most
// once, for a backend that applies a wave in one statement but cannot touch
// a row twice in one statement (SQL's INSERT ... ON CONFLICT DO UPDATE). It
// returns the indexes of ops per wave: wave w holds, for every key, the op
// that comes w-th among that key's ops, in slice order. Applying the waves
// one after the other applies the ops of each key in slice order, as
// [Driver.Apply] promises. A batch whose keys are distinct, the usual case,
// is one wave.
func Waves(ops []Op) [][]int {
	if len(ops) <= 1 {
		if len(ops) == 0 {
			return nil
		}
		return [][]int{{0}}
	}
	seen := make(map[string]int, len(ops)) // key -> its ops so far
	var waves [][]int
	for i, op := range ops {
		w := seen[op.Key]
		seen[op.Key] = w + 1
		if w == len(waves) {
			waves = append(waves, make([]int, 0, len(ops)-i))
		}
		waves[w] = append(waves[w], i)
	}
	return waves
}
