package model

// queue is a FIFO of requests that drops aborted (done) ones lazily.
type queue struct {
	items []*Request
	head  int
}

func (q *queue) push(r *Request) { q.items = append(q.items, r) }

// peek returns the first live request, or nil.
func (q *queue) peek() *Request {
	for q.head < len(q.items) {
		if r := q.items[q.head]; r.state != stateDone {
			return r
		}
		q.items[q.head] = nil
		q.head++
	}
	q.items, q.head = q.items[:0], 0
	return nil
}

func (q *queue) pop() {
	q.items[q.head] = nil
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	} else if q.head > 64 && q.head*2 > len(q.items) {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
}

// block is one cached KV block in an engine's block arena. prev and next
// link the LRU list of unpinned blocks (−1: none). The arena holds no
// pointers, so a large fleet's caches cost the garbage collector nothing to
// scan.
type block struct {
	hash       uint64
	ref        int32
	prev, next int32
}

// blockArena stores an engine's cached blocks by index, recycles freed
// slots, and keeps the LRU list of unpinned cached blocks: the front is
// evicted first.
type blockArena struct {
	b          []block
	free       []int32
	head, tail int32
	n          int // blocks in the LRU list
}

func newBlockArena() blockArena { return blockArena{head: -1, tail: -1} }

// alloc stores a new block and returns its index.
func (a *blockArena) alloc(h uint64, ref int32) int32 {
	if k := len(a.free); k > 0 {
		i := a.free[k-1]
		a.free = a.free[:k-1]
		a.b[i] = block{hash: h, ref: ref, prev: -1, next: -1}
		return i
	}
	a.b = append(a.b, block{hash: h, ref: ref, prev: -1, next: -1})
	return int32(len(a.b) - 1)
}

// drop returns a block's slot (not in the list) to the free slots.
func (a *blockArena) drop(i int32) { a.free = append(a.free, i) }

func (a *blockArena) pushBack(i int32) {
	b := &a.b[i]
	b.prev, b.next = a.tail, -1
	if a.tail >= 0 {
		a.b[a.tail].next = i
	} else {
		a.head = i
	}
	a.tail = i
	a.n++
}

func (a *blockArena) remove(i int32) {
	b := &a.b[i]
	if b.prev >= 0 {
		a.b[b.prev].next = b.next
	} else {
		a.head = b.next
	}
	if b.next >= 0 {
		a.b[b.next].prev = b.prev
	} else {
		a.tail = b.prev
	}
	b.prev, b.next = -1, -1
	a.n--
}

func (a *blockArena) popFront() int32 {
	i := a.head
	a.remove(i)
	return i
}

// blockIndex maps block hashes to arena indexes: open addressing with
// linear probing and backward-shift deletion. Chained block hashes are
// already well mixed, so their low bits pick the slot directly; the table
// holds no pointers and probes stay in one cache line or two.
type blockIndex struct {
	keys []uint64
	vals []int32 // −1: empty slot
	n    int
	mask uint64
}

func newBlockIndex() blockIndex {
	const size = 1024
	m := blockIndex{keys: make([]uint64, size), vals: make([]int32, size), mask: size - 1}
	for i := range m.vals {
		m.vals[i] = -1
	}
	return m
}

func (m *blockIndex) len() int { return m.n }

func (m *blockIndex) get(h uint64) (int32, bool) {
	for i := h & m.mask; ; i = (i + 1) & m.mask {
		v := m.vals[i]
		if v < 0 {
			return 0, false
		}
		if m.keys[i] == h {
			return v, true
		}
	}
}

func (m *blockIndex) put(h uint64, v int32) {
	if 4*(m.n+1) > 3*len(m.vals) {
		m.grow()
	}
	i := h & m.mask
	for ; m.vals[i] >= 0; i = (i + 1) & m.mask {
		if m.keys[i] == h {
			m.vals[i] = v
			return
		}
	}
	m.keys[i], m.vals[i] = h, v
	m.n++
}

func (m *blockIndex) del(h uint64) {
	i := h & m.mask
	for {
		if m.vals[i] < 0 {
			return // absent
		}
		if m.keys[i] == h {
			break
		}
		i = (i + 1) & m.mask
	}
	m.vals[i] = -1
	m.n--
	// Shift back the entries of the cluster after i that may no longer be
	// found past the hole.
	for j := (i + 1) & m.mask; m.vals[j] >= 0; j = (j + 1) & m.mask {
		k := m.keys[j] & m.mask // the entry's home slot
		// It stays if its home lies cyclically in (i, j].
		if (i < j && i < k && k <= j) || (j < i && (k > i || k <= j)) {
			continue
		}
		m.keys[i], m.vals[i] = m.keys[j], m.vals[j]
		m.vals[j] = -1
		i = j
	}
}

func (m *blockIndex) grow() {
	old := *m
	size := 2 * len(old.vals)
	*m = blockIndex{keys: make([]uint64, size), vals: make([]int32, size), mask: uint64(size - 1)}
	for i := range m.vals {
		m.vals[i] = -1
	}
	for i, v := range old.vals {
		if v >= 0 {
			m.put(old.keys[i], v)
		}
	}
}
