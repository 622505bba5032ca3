package fleet

import (
	"reflect"
	"strings"
	"testing"
)

// A fleet in real time at scale 0.5: durations halve, rates double, the
// rest is the same fleet (0.5 then 2 gives the spec back exactly: both are
// powers of two).
func TestInRealTime(t *testing.T) {
	s, err := Load("../../examples/fleet-3region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.InRealTime(0.5)
	if err != nil {
		t.Fatal(err)
	}
	p, q := s.Profiles[0], r.Profiles[0]
	if q.DecodeStepMs != p.DecodeStepMs/2 || q.OverheadMs != p.OverheadMs/2 || q.DecodeStepPerSeqMs != p.DecodeStepPerSeqMs/2 ||
		q.PrefillTokensPerS != 2*p.PrefillTokensPerS || q.CapacityRPS != 2*p.CapacityRPS || q.MaxRunning != p.MaxRunning {
		t.Errorf("profile %+v in real time at 0.5: %+v", p, q)
	}
	l := s.Network.Links[0]
	if got, _ := r.RTTMs(l.A, l.B); got != l.RTTMs/2 {
		t.Errorf("rtt %s-%s %v at 0.5: %v", l.A, l.B, l.RTTMs, got)
	}
	if *r.Network.SameRegionRTTMs != *s.Network.SameRegionRTTMs/2 {
		t.Errorf("same-region rtt %v", *r.Network.SameRegionRTTMs)
	}
	back, err := r.InRealTime(2)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, s) {
		t.Errorf("0.5 then 2 is not the spec:\n%+v\nvs\n%+v", back, s)
	}
	if s.Profiles[0] != p {
		t.Error("InRealTime modified its spec")
	}
	if same, err := s.InRealTime(1); err != nil || same != s {
		t.Errorf("scale 1: %p %v, want the spec itself", same, err)
	}
	for _, bad := range []float64{0, -1} {
		if _, err := s.InRealTime(bad); err == nil || !strings.Contains(err.Error(), "time scale must be a positive number") {
			t.Errorf("scale %v: %v", bad, err)
		}
	}
}
