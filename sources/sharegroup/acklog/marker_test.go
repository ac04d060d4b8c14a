package acklog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// sameMarker compares markers, times by instant.
func sameMarker(a, b Marker) bool {
	if !a.CreatedAt.Equal(b.CreatedAt) {
		return false
	}
	a.CreatedAt, b.CreatedAt = time.Time{}, time.Time{}
	if len(a.Ranges) == 0 && len(b.Ranges) == 0 {
		a.Ranges, b.Ranges = nil, nil
	}
	return reflect.DeepEqual(a, b)
}

func TestMarkerRecordDecodeRoundTrip(t *testing.T) {
	created := time.Date(2026, 3, 4, 5, 6, 7, 891011, time.UTC)
	tests := []struct {
		name string
		m    Marker
	}{
		{"zero marker", Marker{}},
		{"no ranges", Marker{Group: "g", Member: "m", Checkpoint: 1, TransactionalID: "t", ProducerID: 7, CreatedAt: created}},
		{"one range", Marker{Group: "wordcount", Member: "source-0/lane-3", Checkpoint: 42, TransactionalID: "job-src-0",
			ProducerID: 1001, CreatedAt: created, Ranges: map[TopicPartition][]Range{tp0: {{0, 10}}}}},
		{"several partitions and ranges", Marker{Group: "g", Checkpoint: 9, ProducerID: 3, CreatedAt: created,
			Ranges: map[TopicPartition][]Range{
				{"input", 0}: {{0, 1}, {5, 9}, {100, 2000}},
				{"input", 7}: {{3, 4}},
				{"other", 2}: {{1 << 40, 1<<40 + 3}},
			}}},
		{"extreme values", Marker{Group: "ü/grüppe", Member: "", Checkpoint: math.MaxUint64, TransactionalID: "x/y%z",
			ProducerID: math.MaxInt64, CreatedAt: time.Unix(0, -5),
			Ranges: map[TopicPartition][]Range{{"t", math.MaxInt32}: {{0, 1}, {math.MaxInt64 - 2, math.MaxInt64}}, {"t", -1}: {{4, 5}}}}},
		{"negative producer id", Marker{ProducerID: -1, Ranges: map[TopicPartition][]Range{tp0: {{2, 3}}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.m.Record("__weir-acklog-g")
			if r.Topic != "__weir-acklog-g" || r.Partition != 0 {
				t.Fatalf("record topic/partition = %q/%d, want __weir-acklog-g/0", r.Topic, r.Partition)
			}
			if !bytes.Equal(r.Key, tt.m.Key()) || len(r.Key) == 0 {
				t.Fatalf("record key %q, want Key() %q", r.Key, tt.m.Key())
			}
			got, err := Decode(r)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !sameMarker(got, tt.m) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", got, tt.m)
			}
		})
	}
}

func TestRecordNormalizesRanges(t *testing.T) {
	m := Marker{Ranges: map[TopicPartition][]Range{
		tp0:          {{8, 10}, {0, 3}, {3, 5}, {9, 12}, {20, 20}},
		{"empty", 0}: {{5, 5}},
	}}
	got, err := Decode(m.Record("t"))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	want := map[TopicPartition][]Range{tp0: {{0, 5}, {8, 12}}}
	if !reflect.DeepEqual(got.Ranges, want) {
		t.Fatalf("ranges = %v, want %v", got.Ranges, want)
	}
}

func TestMarkerKeysDifferPerMarker(t *testing.T) {
	base := Marker{Group: "g", Member: "m", TransactionalID: "t", ProducerID: 1, Checkpoint: 1, CreatedAt: time.Unix(10, 0)}
	variants := []func(m *Marker){
		func(m *Marker) { m.Group = "g2" },
		func(m *Marker) { m.Member = "m2" },
		func(m *Marker) { m.TransactionalID = "t2" },
		func(m *Marker) { m.ProducerID = 2 },
		func(m *Marker) { m.Checkpoint = 2 },
		func(m *Marker) { m.CreatedAt = m.CreatedAt.Add(1) },
		// '/' in a field must not let two markers share a key.
		func(m *Marker) { m.Group, m.Member = "g/m", "" },
	}
	seen := map[string]bool{string(base.Key()): true}
	for i, v := range variants {
		m := base
		v(&m)
		k := string(m.Key())
		if seen[k] {
			t.Fatalf("variant %d: key %q not unique", i, k)
		}
		seen[k] = true
	}
	if !bytes.Equal(base.Key(), base.Key()) {
		t.Fatal("Key is not stable")
	}
}

// validValue is an encoded marker used to derive malformed values.
func validValue() []byte {
	return Marker{Group: "g", Member: "m", TransactionalID: "t", ProducerID: 5, Checkpoint: 3,
		CreatedAt: time.Unix(100, 0), Ranges: map[TopicPartition][]Range{tp0: {{1, 4}, {10, 12}}}}.Record("t").Value
}

// header is a valid value up to (and including) the created time, so tests
// can append hand-made partition sections.
func header() []byte {
	b := []byte("WAK\x01")
	for range 3 {
		b = binary.AppendUvarint(b, 0) // empty strings
	}
	b = binary.AppendUvarint(b, 1) // checkpoint
	b = binary.AppendVarint(b, 1)  // producer id
	return append(b, 0)            // no created time
}

func partSection(topic string, partition int64, nranges uint64, vals ...int64) []byte {
	b := binary.AppendUvarint(nil, uint64(len(topic)))
	b = append(b, topic...)
	b = binary.AppendVarint(b, partition)
	b = binary.AppendUvarint(b, nranges)
	for i, v := range vals {
		if i == 0 {
			b = binary.AppendVarint(b, v)
		} else {
			b = binary.AppendUvarint(b, uint64(v))
		}
	}
	return b
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func uv(v uint64) []byte { return binary.AppendUvarint(nil, v) }

func TestDecodeRejectsMalformedValues(t *testing.T) {
	valid := validValue()
	tests := []struct {
		name string
		r    *kgo.Record
	}{
		{"nil record", nil},
		{"tombstone", &kgo.Record{Key: []byte("k")}},
		{"empty value", &kgo.Record{Value: []byte{}}},
		{"foreign json", &kgo.Record{Value: []byte(`{"group":"g"}`)}},
		{"unsupported version", &kgo.Record{Value: cat([]byte("WAK\x02"), valid[4:])}},
		{"trailing byte", &kgo.Record{Value: cat(valid, []byte{0})}},
		{"created flag 2", &kgo.Record{Value: cat(header()[:len(header())-1], []byte{2}, uv(0))}},
		{"string longer than value", &kgo.Record{Value: cat([]byte("WAK\x01"), uv(1000), []byte("abc"))}},
		{"huge partition count", &kgo.Record{Value: cat(header(), uv(math.MaxUint64))}},
		{"huge range count", &kgo.Record{Value: cat(header(), uv(1), partSection("t", 0, 1<<40, 0, 1))}},
		{"zero range count", &kgo.Record{Value: cat(header(), uv(1), partSection("t", 0, 0))}},
		{"partition beyond int32", &kgo.Record{Value: cat(header(), uv(1), partSection("t", math.MaxInt32+1, 1, 0, 1))}},
		{"negative start", &kgo.Record{Value: cat(header(), uv(1), partSection("t", 0, 1, -1, 1))}},
		{"zero length range", &kgo.Record{Value: cat(header(), uv(1), partSection("t", 0, 1, 5, 0))}},
		{"unmerged ranges (gap 0)", &kgo.Record{Value: cat(header(), uv(1), partSection("t", 0, 2, 0, 2, 0, 2))}},
		{"range length overflows", &kgo.Record{Value: cat(header(), uv(1), partSection("t", 0, 1, math.MaxInt64-1, 2))}},
		{"range gap overflows", &kgo.Record{Value: cat(header(), uv(1), partSection("t", 0, 2, 0, 2, math.MaxInt64, 1))}},
		{"duplicate partition", &kgo.Record{Value: cat(header(), uv(2), partSection("t", 0, 1, 0, 1), partSection("t", 0, 1, 5, 1))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Decode(tt.r)
			if !errors.Is(err, ErrBadMarker) {
				t.Fatalf("Decode = %+v, %v; want an error wrapping ErrBadMarker", m, err)
			}
		})
	}
	t.Run("tombstone is also ErrTombstone", func(t *testing.T) {
		if _, err := Decode(&kgo.Record{Key: []byte("k")}); !errors.Is(err, ErrTombstone) {
			t.Fatalf("Decode(tombstone) error %v does not wrap ErrTombstone", err)
		}
	})
	t.Run("every truncation", func(t *testing.T) {
		for n := range len(valid) {
			if _, err := Decode(&kgo.Record{Value: valid[:n]}); !errors.Is(err, ErrBadMarker) {
				t.Fatalf("Decode(first %d of %d bytes) error = %v, want ErrBadMarker", n, len(valid), err)
			}
		}
	})
}

func TestDecodeNeverPanicsOnCorruptValues(t *testing.T) {
	valid := validValue()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		v := bytes.Clone(valid)
		for range 1 + rng.IntN(4) {
			v[rng.IntN(len(v))] = byte(rng.Uint32())
		}
		m, err := Decode(&kgo.Record{Value: v})
		if err == nil {
			// Whatever decodes is a valid marker: it survives a round trip.
			again, err := Decode(m.Record("t"))
			if err != nil || !sameMarker(again, m) {
				t.Fatalf("iteration %d: decoded %+v does not round-trip: %+v, %v", i, m, again, err)
			}
		} else if !errors.Is(err, ErrBadMarker) {
			t.Fatalf("iteration %d: error %v does not wrap ErrBadMarker", i, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(validValue())
	f.Add([]byte("WAK\x01"))
	f.Fuzz(func(t *testing.T, v []byte) {
		m, err := Decode(&kgo.Record{Value: v})
		if err != nil {
			if !errors.Is(err, ErrBadMarker) {
				t.Fatalf("error %v does not wrap ErrBadMarker", err)
			}
			return
		}
		if _, err := Decode(m.Record("t")); err != nil {
			t.Fatalf("re-encoded marker does not decode: %v", err)
		}
	})
}

func TestRangesOfMergesOffsets(t *testing.T) {
	tp1 := TopicPartition{"input", 1}
	tests := []struct {
		name string
		in   map[TopicPartition][]int64
		want map[TopicPartition][]Range
	}{
		{"nil", nil, map[TopicPartition][]Range{}},
		{"empty partition dropped", map[TopicPartition][]int64{tp0: {}}, map[TopicPartition][]Range{}},
		{"single", map[TopicPartition][]int64{tp0: {7}}, map[TopicPartition][]Range{tp0: {{7, 8}}}},
		{"contiguous", map[TopicPartition][]int64{tp0: {3, 4, 5, 6}}, map[TopicPartition][]Range{tp0: {{3, 7}}}},
		{"unsorted with gaps and duplicates", map[TopicPartition][]int64{tp0: {9, 1, 2, 2, 10, 4, 0, 9}},
			map[TopicPartition][]Range{tp0: {{0, 3}, {4, 5}, {9, 11}}}},
		{"partitions apart", map[TopicPartition][]int64{tp0: {1}, tp1: {1, 2}},
			map[TopicPartition][]Range{tp0: {{1, 2}}, tp1: {{1, 3}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var before map[TopicPartition][]int64
			if tt.in != nil {
				before = make(map[TopicPartition][]int64)
				for k, v := range tt.in {
					before[k] = slices.Clone(v)
				}
			}
			got := RangesOf(tt.in)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("RangesOf(%v) = %v, want %v", tt.in, got, tt.want)
			}
			if tt.in != nil && !reflect.DeepEqual(tt.in, before) {
				t.Fatalf("RangesOf modified its input: %v, was %v", tt.in, before)
			}
		})
	}
}

func TestMarkerOverlapsCoversMaxOffset(t *testing.T) {
	tp1 := TopicPartition{"input", 1}
	m := Marker{Ranges: map[TopicPartition][]Range{tp0: {{0, 3}, {10, 20}}, tp1: {{5, 6}}}}
	overlaps := []struct {
		name string
		o    map[TopicPartition][]Range
		want bool
	}{
		{"same range", map[TopicPartition][]Range{tp0: {{0, 3}}}, true},
		{"touching end is not overlap", map[TopicPartition][]Range{tp0: {{3, 10}}}, false},
		{"one offset inside", map[TopicPartition][]Range{tp0: {{19, 25}}}, true},
		{"spanning the gap", map[TopicPartition][]Range{tp0: {{2, 11}}}, true},
		{"other partition same offsets", map[TopicPartition][]Range{{"input", 2}: {{0, 100}}}, false},
		{"second partition", map[TopicPartition][]Range{tp1: {{0, 6}}}, true},
		{"many disjoint", map[TopicPartition][]Range{tp0: {{3, 4}, {5, 6}, {8, 10}, {20, 30}}}, false},
		{"empty", nil, false},
	}
	for _, tt := range overlaps {
		t.Run("overlaps/"+tt.name, func(t *testing.T) {
			o := Marker{Ranges: tt.o}
			if got := m.Overlaps(o); got != tt.want {
				t.Fatalf("m.Overlaps = %v, want %v", got, tt.want)
			}
			if got := o.Overlaps(m); got != tt.want {
				t.Fatalf("o.Overlaps (symmetric) = %v, want %v", got, tt.want)
			}
		})
	}
	covers := []struct {
		tp   TopicPartition
		off  int64
		want bool
	}{
		{tp0, 0, true}, {tp0, 2, true}, {tp0, 3, false}, {tp0, 9, false}, {tp0, 10, true},
		{tp0, 19, true}, {tp0, 20, false}, {tp0, -1, false}, {tp1, 5, true}, {tp1, 6, false},
		{TopicPartition{"x", 0}, 0, false},
	}
	for _, c := range covers {
		if got := m.Covers(c.tp, c.off); got != c.want {
			t.Errorf("Covers(%v, %d) = %v, want %v", c.tp, c.off, got, c.want)
		}
	}
	if hi, ok := m.MaxOffset(tp0); !ok || hi != 19 {
		t.Errorf("MaxOffset(tp0) = %d, %v; want 19, true", hi, ok)
	}
	if hi, ok := m.MaxOffset(TopicPartition{"x", 0}); ok {
		t.Errorf("MaxOffset(unknown) = %d, true; want false", hi)
	}
}
