package extproc

import (
	"math/bits"
	"sync"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// Received messages' bytes come from size-classed pools: a request body
// (which aliases its message's bytes, see Codec) was a fresh allocation per
// request — 234 KB per 220 KB decision — and the garbage drove both the
// collector's CPU and, with GOGC 400, a heap of several times the bodies in
// flight. A sync.Pool keeps a buffer only until the second collection after
// its last use, so idle buffers go back to the runtime on their own.

const (
	// minPooledShift: messages below 1<<minPooledShift bytes (request
	// headers, small bodies' neighbours) are allocated as before; a pool
	// round trip costs more than they do.
	minPooledShift = 12
	// maxPooledShift: above 1<<maxPooledShift bytes a buffer is allocated
	// and left to the collector (beyond any body limit in use).
	maxPooledShift = 26
)

var bufPools [maxPooledShift + 1]sync.Pool

// getBuf returns a buffer of length n from the pool of its size class
// (capacity the next power of two), or a fresh one if n is outside the
// pooled sizes.
func getBuf(n int) *[]byte {
	k := bits.Len(uint(n - 1))
	if n <= 0 || k < minPooledShift || k > maxPooledShift {
		b := make([]byte, n)
		return &b
	}
	if p, ok := bufPools[k].Get().(*[]byte); ok {
		*p = (*p)[:n]
		return p
	}
	b := make([]byte, n, 1<<k)
	return &b
}

// putBuf gives a buffer from getBuf back; nothing may use its bytes after.
func putBuf(p *[]byte) {
	c := cap(*p)
	k := bits.Len(uint(c - 1))
	if c == 0 || c != 1<<k || k < minPooledShift || k > maxPooledShift {
		return
	}
	*p = (*p)[:0]
	bufPools[k].Put(p)
}

// received is a ProcessingRequest whose bytes the codec took from the
// pools (Codec.Unmarshal): the message's body and raw header values alias
// buf until release. Its pointer is a proto.Message (the embedded
// message's methods), so any other codec decodes into it as usual.
type received struct {
	extprocv3.ProcessingRequest
	buf *[]byte
}

// release gives the message's bytes back to the pool: nothing that
// aliases them (the body, raw header values) may be used after.
func (r *received) release() {
	if r.buf != nil {
		putBuf(r.buf)
		r.buf = nil
	}
}
