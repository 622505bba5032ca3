// Package hashmix holds the 64-bit finalizers the project uses: bijective
// mixes that spread a hash, a counter or a seed over the whole range, so
// that nearby inputs land far apart. One home, so that two places meaning
// the same mix cannot drift apart.
package hashmix

// SplitMix64 is the finalizer of SplitMix64 (Stafford's Mix13 constants).
func SplitMix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Murmur3 is MurmurHash3's 64-bit finalizer (fmix64).
func Murmur3(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}
