package memory

// table maps the hashes of keys to the slots of their records: open
// addressing with linear probing over a power-of-two array of words, each
// word the low 32 bits of a key's hash and 1 + the record's slot (0: empty).
// A removal shifts the words after it back (no tombstones), and the array
// doubles at three quarters full and never shrinks. It holds no pointers, so
// the garbage collector does not walk it; it costs 8 to 16 bytes a record.
//
// It replaces a map[uint64]int32, whose incremental growth cost about as
// much per new key as the rest of the store's work (callgrind).
type table struct {
	w []uint64
	n int
}

// word is the table word of slot i for a key of hash h.
func word(h uint64, i int32) uint64 { return uint64(uint32(h))<<32 | uint64(uint32(i+1)) }

func (t *table) mask() int { return len(t.w) - 1 }

// home is where the probe for a word or hash of low bits lo starts.
func (t *table) home(lo uint32) int { return int(lo) & t.mask() }

// insert adds x, which must not be present.
func (t *table) insert(x uint64) {
	if (t.n+1)*4 > len(t.w)*3 {
		t.grow()
	}
	t.put(x)
	t.n++
}

func (t *table) put(x uint64) {
	m := t.mask()
	p := t.home(uint32(x >> 32))
	for t.w[p] != 0 {
		p = (p + 1) & m
	}
	t.w[p] = x
}

func (t *table) grow() {
	old := t.w
	t.w = make([]uint64, max(2*len(old), 64))
	for _, x := range old {
		if x != 0 {
			t.put(x)
		}
	}
}

// remove deletes x, which must be present, and shifts back the words after
// it that its slot made probe further.
func (t *table) remove(x uint64) {
	m := t.mask()
	p := t.home(uint32(x >> 32))
	for t.w[p] != x {
		p = (p + 1) & m
	}
	t.n--
	for q := (p + 1) & m; t.w[q] != 0; q = (q + 1) & m {
		// The word at q may fill the hole at p unless its home lies
		// cyclically in (p, q].
		h := t.home(uint32(t.w[q] >> 32))
		if q > p && (h <= p || h > q) || q < p && h <= p && h > q {
			t.w[p] = t.w[q]
			p = q
		}
	}
	t.w[p] = 0
}
