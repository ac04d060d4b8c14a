package acklog

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrBadMarker is wrapped by every error Decode returns: the record is not a
// marker this package can read (malformed, truncated, foreign, a tombstone, a
// control record, or an unsupported version).
var ErrBadMarker = errors.New("bad marker")

// ErrTombstone is wrapped, together with ErrBadMarker, by Decode's error for
// a tombstone (a record with a nil value).
var ErrTombstone = errors.New("tombstone")

// Range is a half-open offset range [Start, End).
type Range struct{ Start, End int64 }

// Len returns the number of offsets in the range (0 if it is empty).
func (r Range) Len() int64 { return max(0, r.End-r.Start) }

// TopicPartition names one partition of a topic.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// String returns "topic[partition]".
func (tp TopicPartition) String() string {
	return tp.Topic + "[" + strconv.Itoa(int(tp.Partition)) + "]"
}

// Marker records that a transaction acknowledges (will ACCEPT once
// committed) these offsets.
type Marker struct {
	// Group is the share group whose records are acknowledged.
	Group string
	// Member is the share member / lane id, for diagnostics.
	Member string
	// Checkpoint is the checkpoint whose epoch the marker covers.
	Checkpoint uint64
	// TransactionalID is the transactional.id of the transaction carrying
	// the marker, for diagnostics.
	TransactionalID string
	// ProducerID identifies the transaction's producer. Transactions are
	// matched by producer id, never by epoch: the epoch bumps after every
	// EndTxn (KIP-890).
	ProducerID int64
	// Ranges are the acknowledged offsets (Kafka offsets, never negative)
	// per topic-partition, each list sorted and merged (as RangesOf returns
	// them). Record normalizes them; Overlaps, Covers and MaxOffset assume
	// it.
	Ranges map[TopicPartition][]Range
	// CreatedAt is when the marker was made, by the writer's clock; the
	// tombstone grace period counts from it.
	CreatedAt time.Time
}

// RangesOf compacts offsets into sorted, merged, half-open ranges per
// topic-partition. Duplicates are allowed; partitions without offsets are left
// out. The input is not modified.
func RangesOf(offsets map[TopicPartition][]int64) map[TopicPartition][]Range {
	out := make(map[TopicPartition][]Range, len(offsets))
	for tp, offs := range offsets {
		if len(offs) == 0 {
			continue
		}
		sorted := slices.Clone(offs)
		slices.Sort(sorted)
		var rs []Range
		for _, o := range sorted {
			if n := len(rs); n > 0 && o <= rs[n-1].End {
				if o == rs[n-1].End {
					rs[n-1].End++
				}
				continue
			}
			rs = append(rs, Range{Start: o, End: o + 1})
		}
		out[tp] = rs
	}
	return out
}

// normalize returns rs sorted and merged (overlapping or adjacent ranges
// joined, empty ranges dropped), as a new slice.
func normalize(rs []Range) []Range {
	out := make([]Range, 0, len(rs))
	for _, r := range rs {
		if r.End > r.Start {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b Range) int { return cmp.Compare(a.Start, b.Start) })
	merged := out[:0]
	for _, r := range out {
		if n := len(merged); n > 0 && r.Start <= merged[n-1].End {
			merged[n-1].End = max(merged[n-1].End, r.End)
			continue
		}
		merged = append(merged, r)
	}
	return merged
}

// overlapping reports whether two sorted, merged range lists share an offset.
func overlapping(a, b []Range) bool {
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		if a[i].Start < b[j].End && b[j].Start < a[i].End {
			return true
		}
		if a[i].End <= b[j].End {
			i++
		} else {
			j++
		}
	}
	return false
}

// Overlaps reports whether m and o acknowledge at least one common offset of
// a common topic-partition.
func (m Marker) Overlaps(o Marker) bool {
	small, big := m.Ranges, o.Ranges
	if len(small) > len(big) {
		small, big = big, small
	}
	for tp, rs := range small {
		if overlapping(rs, big[tp]) {
			return true
		}
	}
	return false
}

// Covers reports whether m acknowledges offset of tp.
func (m Marker) Covers(tp TopicPartition, offset int64) bool {
	rs := m.Ranges[tp]
	// First range whose End is beyond offset.
	i, _ := slices.BinarySearchFunc(rs, offset, func(r Range, off int64) int {
		if r.End <= off {
			return -1
		}
		return 1
	})
	return i < len(rs) && rs[i].Start <= offset && offset < rs[i].End
}

// MaxOffset returns the highest offset of tp that m acknowledges, and false
// if it acknowledges none.
func (m Marker) MaxOffset(tp TopicPartition) (int64, bool) {
	rs := m.Ranges[tp]
	if len(rs) == 0 {
		return 0, false
	}
	return rs[len(rs)-1].End - 1, true
}

// Key returns the marker's record key: unique per marker (group, member,
// transactional id, producer id, checkpoint and creation time), readable, and
// stable, so that a tombstone with the same key deletes exactly this marker
// when the ack-log is compacted.
func (m Marker) Key() []byte {
	var created int64
	if !m.CreatedAt.IsZero() {
		created = m.CreatedAt.UnixNano()
	}
	var b strings.Builder
	b.WriteString("weir-ack/")
	b.WriteString(url.PathEscape(m.Group))
	b.WriteByte('/')
	b.WriteString(url.PathEscape(m.Member))
	b.WriteByte('/')
	b.WriteString(url.PathEscape(m.TransactionalID))
	b.WriteByte('/')
	b.WriteString(strconv.FormatInt(m.ProducerID, 10))
	b.WriteByte('/')
	b.WriteString(strconv.FormatUint(m.Checkpoint, 10))
	b.WriteByte('/')
	b.WriteString(strconv.FormatInt(created, 10))
	return []byte(b.String())
}

// Record returns the marker as a record for the ack-log topic: key from Key,
// value the versioned binary encoding (ranges normalized), partition 0, and
// timestamp CreatedAt when set. The ack-log has one partition, so any
// partitioner puts it in partition 0.
func (m Marker) Record(topic string) *kgo.Record {
	r := &kgo.Record{
		Topic:     topic,
		Partition: 0,
		Key:       m.Key(),
		Value:     m.encode(),
	}
	if !m.CreatedAt.IsZero() {
		r.Timestamp = m.CreatedAt
	}
	return r
}

// Encoding, version 1 (integers are Go varints / uvarints):
//
//	"WAK" version(1 byte)
//	group, member, transactional id: uvarint length + bytes
//	checkpoint: uvarint; producer id: varint
//	has created (1 byte 0|1) [created: varint unix nanos]
//	partitions: uvarint count, each sorted by topic then partition:
//	  topic: uvarint length + bytes; partition: varint
//	  ranges: uvarint count (> 0); first: varint start, uvarint length (> 0);
//	  next: uvarint gap from the previous end (> 0), uvarint length (> 0)
//
// The value must be consumed exactly.
const (
	magic          = "WAK"
	encodeVersion  = 1
	maxStringBytes = 1 << 20
)

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func (m Marker) encode() []byte {
	type part struct {
		tp TopicPartition
		rs []Range
	}
	parts := make([]part, 0, len(m.Ranges))
	for tp, rs := range m.Ranges {
		if rs = normalize(rs); len(rs) > 0 {
			parts = append(parts, part{tp, rs})
		}
	}
	slices.SortFunc(parts, func(a, b part) int {
		return cmp.Or(cmp.Compare(a.tp.Topic, b.tp.Topic), cmp.Compare(a.tp.Partition, b.tp.Partition))
	})

	b := make([]byte, 0, 64+len(m.Group)+len(m.Member)+len(m.TransactionalID)+16*len(parts))
	b = append(b, magic...)
	b = append(b, encodeVersion)
	b = appendString(b, m.Group)
	b = appendString(b, m.Member)
	b = appendString(b, m.TransactionalID)
	b = binary.AppendUvarint(b, m.Checkpoint)
	b = binary.AppendVarint(b, m.ProducerID)
	if m.CreatedAt.IsZero() {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		b = binary.AppendVarint(b, m.CreatedAt.UnixNano())
	}
	b = binary.AppendUvarint(b, uint64(len(parts)))
	for _, p := range parts {
		b = appendString(b, p.tp.Topic)
		b = binary.AppendVarint(b, int64(p.tp.Partition))
		b = binary.AppendUvarint(b, uint64(len(p.rs)))
		for i, r := range p.rs {
			if i == 0 {
				b = binary.AppendVarint(b, r.Start)
			} else {
				b = binary.AppendUvarint(b, uint64(r.Start-p.rs[i-1].End))
			}
			b = binary.AppendUvarint(b, uint64(r.End-r.Start))
		}
	}
	return b
}

// decoder reads the encoding; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrBadMarker}, args...)...)
	}
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("%s: truncated or overflowing uvarint", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("%s: truncated or overflowing varint", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte1(what string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail("%s: truncated", what)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) str(what string) string {
	n := d.uvarint(what + " length")
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) || n > maxStringBytes {
		d.fail("%s: length %d exceeds the %d bytes left", what, n, len(d.b))
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// count reads a count of items that each take at least minBytes, refusing
// counts the remaining bytes cannot hold (so a corrupt count cannot make
// Decode allocate much).
func (d *decoder) count(what string, minBytes int) int {
	n := d.uvarint(what)
	if d.err != nil {
		return 0
	}
	if n > uint64(len(d.b)/minBytes) {
		d.fail("%s %d exceeds what the %d bytes left can hold", what, n, len(d.b))
		return 0
	}
	return int(n)
}

// Decode decodes a marker record. Every error wraps ErrBadMarker: nil
// records, tombstones (also ErrTombstone), control records, foreign values,
// unsupported versions, truncated or trailing bytes, and ranges that are
// empty, unsorted, unmerged, negative or overflowing. It never panics.
func Decode(r *kgo.Record) (Marker, error) {
	switch {
	case r == nil:
		return Marker{}, fmt.Errorf("%w: nil record", ErrBadMarker)
	case r.Attrs.IsControl():
		return Marker{}, fmt.Errorf("%w: control record at offset %d", ErrBadMarker, r.Offset)
	case r.Value == nil:
		return Marker{}, fmt.Errorf("%w: %w at offset %d", ErrBadMarker, ErrTombstone, r.Offset)
	}
	m, err := decodeValue(r.Value)
	if err != nil {
		return Marker{}, fmt.Errorf("%w (record at offset %d)", err, r.Offset)
	}
	return m, nil
}

func decodeValue(v []byte) (Marker, error) {
	if len(v) < len(magic)+1 || string(v[:len(magic)]) != magic {
		return Marker{}, fmt.Errorf("%w: not an ack marker (no %q prefix)", ErrBadMarker, magic)
	}
	if v[len(magic)] != encodeVersion {
		return Marker{}, fmt.Errorf("%w: unsupported version %d (want %d)", ErrBadMarker, v[len(magic)], encodeVersion)
	}
	d := &decoder{b: v[len(magic)+1:]}
	var m Marker
	m.Group = d.str("group")
	m.Member = d.str("member")
	m.TransactionalID = d.str("transactional id")
	m.Checkpoint = d.uvarint("checkpoint")
	m.ProducerID = d.varint("producer id")
	switch d.byte1("created flag") {
	case 0:
	case 1:
		m.CreatedAt = time.Unix(0, d.varint("created"))
	default:
		d.fail("created flag is neither 0 nor 1")
	}
	nparts := d.count("partition count", 3)
	if nparts > 0 {
		m.Ranges = make(map[TopicPartition][]Range, nparts)
	}
	for range nparts {
		if d.err != nil {
			break
		}
		var tp TopicPartition
		tp.Topic = d.str("topic")
		p := d.varint("partition")
		if d.err == nil && (p < math.MinInt32 || p > math.MaxInt32) {
			d.fail("partition %d out of int32 range", p)
		}
		tp.Partition = int32(p)
		if _, dup := m.Ranges[tp]; dup && d.err == nil {
			d.fail("duplicate partition %s", tp)
		}
		nranges := d.count("range count", 2)
		if d.err == nil && nranges == 0 {
			d.fail("%s has no ranges", tp)
		}
		rs := make([]Range, 0, nranges)
		var end int64
		for i := range nranges {
			var start int64
			if i == 0 {
				start = d.varint("range start")
				if d.err == nil && start < 0 {
					d.fail("%s: negative offset %d", tp, start)
				}
			} else {
				gap := d.uvarint("range gap")
				if d.err == nil && (gap == 0 || gap > uint64(math.MaxInt64-end)) {
					d.fail("%s: range gap %d is zero (unmerged) or overflows", tp, gap)
				}
				start = end + int64(gap)
			}
			n := d.uvarint("range length")
			if d.err == nil && (n == 0 || n > uint64(math.MaxInt64-start)) {
				d.fail("%s: range length %d is zero or overflows", tp, n)
			}
			if d.err != nil {
				break
			}
			end = start + int64(n)
			rs = append(rs, Range{Start: start, End: end})
		}
		m.Ranges[tp] = rs
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return Marker{}, d.err
	}
	return m, nil
}
