package hashmix

import "testing"

// The finalizers are the published ones: reference outputs of SplitMix64's
// generator (seed 0, whose first output is SplitMix64(0x9e3779b97f4a7c15))
// and MurmurHash3's fmix64, and both keep 0 at 0 (they are bijections that
// fix it; callers that reserve 0 handle it).
func TestReferenceValues(t *testing.T) {
	if got := SplitMix64(0x9e3779b97f4a7c15); got != 0xe220a8397b1dcdaf {
		t.Errorf("SplitMix64: %#x, want 0xe220a8397b1dcdaf", got)
	}
	if got := Murmur3(1); got != 0xb456bcfc34c2cb2c {
		t.Errorf("Murmur3(1): %#x, want 0xb456bcfc34c2cb2c", got)
	}
	if SplitMix64(0) != 0 || Murmur3(0) != 0 {
		t.Error("0 does not map to 0")
	}
}
