package runtime

import (
	"bytes"
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// ownerTestKeys are string keys whose frames compare differently from the
// strings themselves: lengths around the one-byte uvarint's 127 and the
// two-byte one's 16383, and keys that are prefixes of others.
func ownerTestKeys() []string {
	keys := []string{"", "a", "b", "ab", "ba", "aa", "z", "zz", "\xff", "\x00", "é"}
	for _, n := range []int{126, 127, 128, 129, 255, 256, 300, 16383, 16384, 16385} {
		keys = append(keys, strings.Repeat("a", n), strings.Repeat("b", n), strings.Repeat("a", n-1)+"c")
	}
	return keys
}

// The comparison of string-keyed owners that the heap's timer queue sorts
// ties with orders every pair of owners as the bytes of their snapshot
// encodings (appendOwner) compare, so that timers fire in the order a
// restore from their encodings gives.
func TestStringOwnersCompareAsTheirEncodings(t *testing.T) {
	tm := &Timers[string, struct{}]{keyCodec: StringCodec(), nsCodec: DefaultCodec[struct{}]()}
	order := ownerOrder[string, struct{}](tm.keyCodec)
	if order == nil {
		t.Fatal("no order for string keys and a zero-size namespace")
	}
	keys := ownerTestKeys()
	for _, a := range keys {
		for _, b := range keys {
			oa, ob := timerOwner[string, struct{}]{key: a}, timerOwner[string, struct{}]{key: b}
			want := bytes.Compare(tm.appendOwner(nil, oa), tm.appendOwner(nil, ob))
			if got := order(oa, ob); cmp.Compare(got, 0) != want {
				t.Fatalf("keys of %d and %d bytes: compared %d, their encodings %d", len(a), len(b), got, want)
			}
		}
	}
}

// The comparison of integer-keyed owners (int64, int and uint64 keys under
// their 8-byte codecs) orders every pair as the bytes of their snapshot
// encodings compare: negative keys after the others, as their bits are.
func TestIntegerOwnersCompareAsTheirEncodings(t *testing.T) {
	vals := []int64{0, 1, -1, 2, -2, 255, 256, -256, 1 << 31, -(1 << 31), 1<<62 + 5, math.MaxInt64, math.MinInt64, math.MinInt64 + 1}
	t.Run("int64", func(t *testing.T) { checkIntegerOwnerOrder(t, Int64Codec(), vals) })
	ints := make([]int, len(vals))
	u64s := make([]uint64, len(vals))
	for i, v := range vals {
		ints[i], u64s[i] = int(v), uint64(v)
	}
	t.Run("int", func(t *testing.T) { checkIntegerOwnerOrder(t, IntCodec(), ints) })
	t.Run("uint64", func(t *testing.T) { checkIntegerOwnerOrder(t, Uint64Codec(), u64s) })
}

func checkIntegerOwnerOrder[I comparable](t *testing.T, kc Codec[I], vals []I) {
	t.Helper()
	tm := &Timers[I, struct{}]{keyCodec: kc, nsCodec: DefaultCodec[struct{}]()}
	order := ownerOrder[I, struct{}](kc)
	if order == nil {
		t.Fatalf("no order for %T keys and a zero-size namespace", *new(I))
	}
	for _, a := range vals {
		for _, b := range vals {
			oa, ob := timerOwner[I, struct{}]{key: a}, timerOwner[I, struct{}]{key: b}
			want := bytes.Compare(tm.appendOwner(nil, oa), tm.appendOwner(nil, ob))
			if got := order(oa, ob); cmp.Compare(got, 0) != want {
				t.Fatalf("keys %v and %v: compared %d, their encodings %d", a, b, got, want)
			}
		}
	}
}

// Owners whose order the queue cannot know without encoding them get no
// comparison: other key codecs, and namespaces with more than one value.
func TestOwnerOrderIsOnlyForKnownKeyCodecsAndZeroSizeNamespaces(t *testing.T) {
	if ownerOrder[int64, struct{}](JSONCodec[int64]{}) != nil {
		t.Error("an order for int64 keys under JSON")
	}
	if ownerOrder[int64, TimeWindow](Int64Codec()) != nil {
		t.Error("an order for int64 keys with a window namespace")
	}
	if ownerOrder[string, TimeWindow](StringCodec()) != nil {
		t.Error("an order for a window namespace")
	}
	if ownerOrder[string, struct{}](JSONCodec[string]{}) != nil {
		t.Error("an order for string keys under another codec")
	}
}

// The heap's event-time timers of a string-keyed operator (the window
// operator's, a keyed process function's) fire ties in the order of their
// owners' encodings without encoding an owner: ordering the timers of one
// timestamp, and a timer registered at that timestamp while they fire,
// which joins them in order.
func TestStringKeyedTimersOrderTiesWithoutEncodingOwners(t *testing.T) {
	tm, err := NewTimers[struct{}](&StateRegistry[string]{b: newKeyedBackend[string](StringCodec(), 8)}, "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	q := tm.q[EventTime-1].(heapTimers[timerOwner[string, struct{}]]).q
	enc, encoded := q.enc, 0
	q.enc = func(dst []byte, o timerOwner[string, struct{}]) []byte {
		encoded++
		return enc(dst, o)
	}
	keys := ownerTestKeys()
	late := keys[len(keys)-1] // registered while its timestamp fires
	keys = keys[:len(keys)-1]
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	for _, k := range keys {
		q.register(0, timerOwner[string, struct{}]{key: k}, 5)
		q.register(0, timerOwner[string, struct{}]{key: k}, 3)
	}
	type fired struct {
		ts  int64
		key string
	}
	var got []fired
	for {
		id, _, ok := q.next(10)
		if !ok {
			break
		}
		got = append(got, fired{id.ts, id.owner.key})
		if id.ts == 5 && len(got) == len(keys)+3 {
			q.register(0, timerOwner[string, struct{}]{key: late}, 5)
		}
	}
	want := make([]fired, 0, 2*len(keys)+1)
	for _, ts := range []int64{3, 5} {
		for _, k := range keys {
			want = append(want, fired{ts, k})
		}
	}
	want = append(want, fired{5, late})
	slices.SortFunc(want, func(a, b fired) int {
		if c := cmp.Compare(a.ts, b.ts); c != 0 {
			return c
		}
		return bytes.Compare(tm.appendOwner(nil, timerOwner[string, struct{}]{key: a.key}), tm.appendOwner(nil, timerOwner[string, struct{}]{key: b.key}))
	})
	if len(got) != len(want) {
		t.Fatalf("%d timers fired, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("timer %d: key of %d bytes at %d, want key of %d bytes at %d", i, len(got[i].key), got[i].ts, len(want[i].key), want[i].ts)
		}
	}
	if encoded != 0 {
		t.Errorf("%d owners encoded to order %d timers", encoded, len(got))
	}
}
