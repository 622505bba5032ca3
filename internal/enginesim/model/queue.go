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

// block is one cached KV block.
type block struct {
	hash       uint64
	ref        int32
	prev, next *block
}

// blockList is an intrusive doubly linked LRU list of unpinned cached blocks;
// the front is evicted first.
type blockList struct {
	head, tail *block
	n          int
}

func (l *blockList) pushBack(b *block) {
	b.prev, b.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = b
	} else {
		l.head = b
	}
	l.tail = b
	l.n++
}

func (l *blockList) remove(b *block) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		l.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		l.tail = b.prev
	}
	b.prev, b.next = nil, nil
	l.n--
}

func (l *blockList) popFront() *block {
	b := l.head
	l.remove(b)
	return b
}
