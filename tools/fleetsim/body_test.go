package fleetsim

import (
	"encoding/json"
	"testing"
	"time"
)

// appendJSONString writes what encoding/json reads back as the same string
// (invalid UTF-8 as U+FFFD, as encoding/json does).
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "plain words", `q"uote\back`, "tab\tnl\ncr\r\x01\x1f", "héllo ✓", "bad\xffutf8", "\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := appendJSONString(nil, s)
		var got string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%q → %s: %v", s, b, err)
		}
		want, _ := json.Marshal(s)
		var w string
		_ = json.Unmarshal(want, &w)
		if got != w {
			t.Fatalf("%q → %q, encoding/json gives %q", s, got, w)
		}
	})
}

// The event queue pops in (time, push order) order.
func TestQueueOrder(t *testing.T) {
	var q queue
	times := []int{5, 3, 9, 3, 1, 7, 3, 8, 2, 6, 0, 4, 9, 1}
	for i, v := range times {
		q.push(event{t: time.Duration(1000 * v), a: int32(i)})
	}
	last, lastSeq := int64(-1), uint64(0)
	for q.len() > 0 {
		e := q.pop()
		if int64(e.t) < last || (int64(e.t) == last && e.seq < lastSeq) {
			t.Fatalf("popped %v (seq %d) after %v (seq %d)", e.t, e.seq, last, lastSeq)
		}
		last, lastSeq = int64(e.t), e.seq
	}
}
