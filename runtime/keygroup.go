package runtime

// DefaultMaxParallelism is the number of key groups keyed state is split into
// unless a job sets another: the upper bound of any keyed operator's
// parallelism, and the unit in which keyed state moves on rescale.
const DefaultMaxParallelism = 128

// hashKey hashes key bytes (FNV-1a, then a murmur3 finalizer to spread the
// low bits that the modulo uses).
func hashKey(b []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range b {
		h ^= uint32(c)
		h *= 16777619
	}
	return fmix32(h)
}

func hashString(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return fmix32(h)
}

func fmix32(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// KeyGroupOf returns the key group of key bytes for a max parallelism.
func KeyGroupOf(key []byte, maxParallelism int) int {
	return int(hashKey(key) % uint32(maxParallelism))
}

// SubtaskOf returns the subtask that owns a key group, as Flink assigns them:
// contiguous ranges of key groups per subtask.
func SubtaskOf(keyGroup, maxParallelism, parallelism int) int {
	return keyGroup * parallelism / maxParallelism
}

// KeyGroupRange returns the key groups subtask owns.
func KeyGroupRange(subtask, maxParallelism, parallelism int) []int {
	var kgs []int
	for kg := 0; kg < maxParallelism; kg++ {
		if SubtaskOf(kg, maxParallelism, parallelism) == subtask {
			kgs = append(kgs, kg)
		}
	}
	return kgs
}

// KeyGroupSpan returns the key groups subtask owns as the range [lo, hi)
// (empty when it owns none).
func KeyGroupSpan(subtask, maxParallelism, parallelism int) (lo, hi int) {
	kgs := KeyGroupRange(subtask, maxParallelism, parallelism)
	if len(kgs) == 0 {
		return 0, 0
	}
	return kgs[0], kgs[len(kgs)-1] + 1
}
