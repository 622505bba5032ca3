// Package syncbuf is a bytes.Buffer that concurrent writers may share: a
// log destination for handlers running on several goroutines, read by a
// test while they write.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is safe for concurrent Write and String; the zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer // guarded by mu
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
