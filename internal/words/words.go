// Package words makes prompt text whose length under the project's token
// rule (internal/tokens) is known before it is sent: pseudo-random words of
// 2–7 lowercase letters, one token each, the same for the same seed. The
// workloads (tools/workload), the fleet simulator and `inferlb profile`'s
// load sweep build their prompts from it.
package words

import (
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"unsafe"

	"github.com/inferlb/inferlb/internal/tokens"
)

// vocab is a fixed vocabulary of 4096 distinct words of 2–7 lowercase
// letters, the same in every process (built from a constant seed), so a seed
// always yields the same text.
var vocab = buildVocab()

const vocabBits = 12

func buildVocab() []string {
	rng := rand.New(rand.NewPCG(0x696e6665726c62, 0x766f636162))
	seen := make(map[string]bool, 1<<vocabBits)
	out := make([]string, 0, 1<<vocabBits)
	var b [7]byte
	for len(out) < 1<<vocabBits {
		n := 2 + rng.IntN(6)
		for i := 0; i < n; i++ {
			b[i] = byte('a' + rng.IntN(26))
		}
		w := string(b[:n])
		if !seen[w] {
			seen[w] = true
			out = append(out, w)
		}
	}
	return out
}

// wordStream is the sequence of vocabulary indices a seed stands for: each
// PCG output gives 64/vocabBits words. Words, AppendIDs and Writer read the
// same stream, so their texts and ids agree.
type wordStream struct {
	rng  *rand.PCG
	bits uint64
	left int
}

func newWordStream(seed uint64) wordStream {
	return wordStream{rng: rand.NewPCG(seed, 0x776f726473)}
}

// next is the index of the stream's next word.
func (s *wordStream) next() uint64 {
	if s.left == 0 {
		s.bits, s.left = s.rng.Uint64(), 64/vocabBits
	}
	k := s.bits & (1<<vocabBits - 1)
	s.bits >>= vocabBits
	s.left--
	return k
}

// Writer builds a text of words from several seeds (a prompt made of shared
// blocks), separated by single spaces. The zero Writer is empty.
type Writer struct {
	sb    strings.Builder
	words int
}

// Grow makes room for about n more words.
func (w *Writer) Grow(n int) { w.sb.Grow(n * 6) }

// Add appends n words drawn from the stream seeded by seed.
func (w *Writer) Add(seed uint64, n int) {
	if n <= 0 {
		return
	}
	ws := newWordStream(seed)
	for i := 0; i < n; i++ {
		if w.words > 0 {
			w.sb.WriteByte(' ')
		}
		w.sb.WriteString(vocab[ws.next()])
		w.words++
	}
}

// Len is the number of words written.
func (w *Writer) Len() int { return w.words }

// String is the text written.
func (w *Writer) String() string { return w.sb.String() }

// Words returns n pseudo-random words (one token each under the token rule)
// separated by single spaces, the same for the same seed. Words(s, m) is a
// prefix of Words(s, n) for m ≤ n.
func Words(seed uint64, n int) string {
	if n <= 0 {
		return ""
	}
	// Each word and its space fit in 8 bytes (words have at most 7
	// letters): one store per word, the same text as Writer writes.
	buf := make([]byte, 8*n)
	pos := 0
	ws := newWordStream(seed)
	for i := 0; i < n; i++ {
		k := ws.next()
		binary.LittleEndian.PutUint64(buf[pos:], vocabPacked[k])
		pos += int(vocabLen[k]) + 1
	}
	return unsafe.String(&buf[0], pos-1) // without the last space; buf is not touched again
}

// vocabPacked[i] is word i and a space, little-endian in 8 bytes;
// vocabLen[i] its length without the space.
var vocabPacked, vocabLen = func() ([]uint64, []uint8) {
	p, l := make([]uint64, len(vocab)), make([]uint8, len(vocab))
	for i, w := range vocab {
		var b [8]byte
		copy(b[:], w)
		b[len(w)] = ' '
		p[i], l[i] = binary.LittleEndian.Uint64(b[:]), uint8(len(w))
	}
	return p, l
}()

// vocabIDs are the token ids of the vocabulary's words (one token each).
var vocabIDs = func() []uint64 {
	out := make([]uint64, len(vocab))
	for i, w := range vocab {
		out[i] = tokens.Append(nil, w)[0]
	}
	return out
}()

// AppendIDs appends the token ids of Words(seed, n) to dst without
// building the text: what the token rule makes of it, word by word.
func AppendIDs(dst []uint64, seed uint64, n int) []uint64 {
	if n <= 0 {
		return dst
	}
	ws := newWordStream(seed)
	for i := 0; i < n; i++ {
		dst = append(dst, vocabIDs[ws.next()])
	}
	return dst
}
