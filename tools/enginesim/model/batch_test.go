package model

import (
	"math/rand/v2"
	"testing"
	"time"
)

// batchRec is a listener that takes decode tokens in batches.
type batchRec struct {
	*rec
	batched int
}

func (b *batchRec) Tokens(r *Request, n int, last, step time.Duration) {
	b.batched += n
	// Expand to the per-token times step by step would have reported.
	for i := n - 1; i >= 0; i-- {
		b.tokens[r] = append(b.tokens[r], last-time.Duration(i)*step)
	}
}

// A TokenBatcher listener changes nothing but the number of events: the
// same requests, submitted, aborted, slowed and hung at the same times,
// get the same token times, finish times, cache hits and counters as step
// by step, on random workloads with shared prefixes.
func TestBatchedDecodeIsExact(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		cfg := testCfg()
		cfg.MaxRunning = 8
		cfg.KVCapacityTokens = 16 * 400
		plain, batched := newRec(), &batchRec{rec: newRec()}
		ep, _ := New(cfg, plain)
		eb, _ := New(cfg, batched)
		rng := rand.New(rand.NewPCG(seed, 7))
		var rp, rb []*Request
		now := time.Duration(0)
		wakes := [2]int{}
		drive := func(until time.Duration) {
			for i, e := range []*Engine{ep, eb} {
				for {
					t, ok := e.NextEvent()
					if !ok || t > until {
						break
					}
					e.Advance(t)
					wakes[i]++
				}
				e.Advance(until)
			}
		}
		for op := 0; op < 120; op++ {
			now += time.Duration(rng.IntN(400)) * time.Millisecond
			drive(now)
			switch x := rng.IntN(20); {
			case x < 14:
				pr := prompt(uint64(rng.IntN(4)), 16+rng.IntN(100))
				pr = append(pr, prompt(seed*1000+uint64(op), rng.IntN(40)+1)...)
				n := 1 + rng.IntN(60)
				a, b := &Request{Prompt: pr, MaxTokens: n}, &Request{Prompt: pr, MaxTokens: n}
				if ep.Submit(a, now) == nil {
					if err := eb.Submit(b, now); err != nil {
						t.Fatal(err)
					}
					rp, rb = append(rp, a), append(rb, b)
				}
			case x < 16 && len(rp) > 0:
				i := rng.IntN(len(rp))
				ep.Abort(rp[i], now)
				eb.Abort(rb[i], now)
			case x < 17:
				f := 0.5 + rng.Float64()*2
				_ = ep.SetSlowdown(f)
				_ = eb.SetSlowdown(f)
			case x < 18:
				// As Replicas.SetFaults does: slowdown at the last
				// advance, then hang or resume at now.
				now += time.Duration(rng.IntN(300)) * time.Millisecond
				f, h := 0.5+rng.Float64()*2, rng.IntN(2) == 0
				for _, e := range []*Engine{ep, eb} {
					_ = e.SetSlowdown(f)
					e.SetHang(h, now)
				}
			default:
				h := rng.IntN(3) == 0
				ep.SetHang(h, now)
				eb.SetHang(h, now)
			}
			for _, e := range []*Engine{ep, eb} {
				if next, ok := e.NextEvent(); ok && next < e.Now() {
					t.Fatalf("seed %d op %d: next event %v before now %v", seed, op, next, e.Now())
				}
			}
			if sp, sb := ep.Stats(), eb.Stats(); sp != sb {
				t.Fatalf("seed %d op %d: stats differ\nplain   %+v\nbatched %+v", seed, op, sp, sb)
			}
		}
		ep.SetHang(false, now)
		eb.SetHang(false, now)
		drive(now + time.Hour)
		for i := range rp {
			a, b := rp[i], rb[i]
			if a.Finished != b.Finished || a.FirstToken != b.FirstToken || a.LastToken != b.LastToken ||
				a.CachedTokens != b.CachedTokens || a.Generated != b.Generated || a.Reason != b.Reason {
				t.Fatalf("seed %d request %d differs:\nplain   %+v\nbatched %+v", seed, i, *a, *b)
			}
			if len(plain.tokens[a]) != len(batched.tokens[b]) {
				t.Fatalf("seed %d request %d: %d vs %d tokens", seed, i, len(plain.tokens[a]), len(batched.tokens[b]))
			}
			for k, tp := range plain.tokens[a] {
				if d := tp - batched.tokens[b][k]; d > time.Microsecond || d < -time.Microsecond {
					t.Fatalf("seed %d request %d token %d at %v vs %v\nplain %v\nbatch %v\n%+v", seed, i, k, tp, batched.tokens[b][k], plain.tokens[a][max(0, k-3):min(k+3, len(plain.tokens[a]))], batched.tokens[b][max(0, k-3):min(k+3, len(plain.tokens[a]))], *a)
				}
			}
		}
		if ep.Stats() != eb.Stats() {
			t.Fatalf("seed %d: final stats differ", seed)
		}
		if seed == 1 {
			t.Logf("wake-ups: %d step by step, %d batched (%d tokens batched)", wakes[0], wakes[1], batched.batched)
		}
	}
}

// The block index agrees with a Go map through random puts, gets and
// deletes, growth included, with keys crowded into a few home slots.
func TestBlockIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	m := newBlockIndex()
	ref := map[uint64]int32{}
	for op := 0; op < 100000; op++ {
		// Few distinct low bits: long probe clusters.
		k := uint64(rng.IntN(5000))<<12 | uint64(rng.IntN(64))
		switch rng.IntN(3) {
		case 0:
			v := int32(rng.IntN(1 << 20))
			m.put(k, v)
			ref[k] = v
		case 1:
			m.del(k)
			delete(ref, k)
		default:
			v, ok := m.get(k)
			w, wok := ref[k]
			if ok != wok || v != w {
				t.Fatalf("op %d key %x: got %d,%v want %d,%v", op, k, v, ok, w, wok)
			}
		}
		if m.len() != len(ref) {
			t.Fatalf("op %d: len %d want %d", op, m.len(), len(ref))
		}
	}
	for k, w := range ref {
		if v, ok := m.get(k); !ok || v != w {
			t.Fatalf("key %x lost", k)
		}
	}
}
