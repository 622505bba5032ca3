package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// Writers on many goroutines lose nothing (and the race detector sees no
// race between them and a reader).
func TestConcurrentWritersLoseNothing(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				_, _ = b.Write([]byte("x"))
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	if got := b.String(); got != strings.Repeat("x", 800) {
		t.Fatalf("%d bytes written, want 800", len(got))
	}
}
