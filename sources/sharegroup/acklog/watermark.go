package acklog

import (
	"encoding/binary"
	"fmt"
	"math"
	"net/url"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Watermark records that every offset of a partition below Offset is done
// for the group: processed and committed (or dead-lettered) through markers,
// or never the group's to process (below where the group started). It
// outlives the markers it replaces: markers below it may be tombstoned, and
// the redelivery lookup still recognises their records if a share
// partition's state is lost or reset and they come back at delivery count 1.
// It is also the baseline of the check that a share start offset never jumps
// past records no committed marker covers (docs/architecture.md,
// "Share state lost or reset").
//
// Watermarks are written without a transaction and are compacted by key (one
// key per group and partition); an Index keeps the highest it has read.
type Watermark struct {
	Group  string
	TP     TopicPartition
	Offset int64
}

// Encoding, version 1: "WWM" version(1 byte), group and topic as uvarint
// length + bytes, partition varint, offset varint; consumed exactly.
const (
	watermarkMagic   = "WWM"
	watermarkVersion = 1
)

// Key returns the watermark's record key: one per group and partition, so
// compaction keeps the latest.
func (w Watermark) Key() []byte {
	return []byte("weir-ack-watermark/" + url.PathEscape(w.Group) + "/" + url.PathEscape(w.TP.Topic) + "/" +
		strconv.Itoa(int(w.TP.Partition)))
}

// Record returns the watermark as a record of the ack-log topic.
func (w Watermark) Record(topic string) *kgo.Record {
	b := append([]byte(watermarkMagic), watermarkVersion)
	b = appendString(b, w.Group)
	b = appendString(b, w.TP.Topic)
	b = binary.AppendVarint(b, int64(w.TP.Partition))
	b = binary.AppendVarint(b, w.Offset)
	return &kgo.Record{Topic: topic, Partition: 0, Key: w.Key(), Value: b}
}

// isWatermark reports whether a record value is a watermark (of any version).
func isWatermark(v []byte) bool {
	return len(v) > len(watermarkMagic) && string(v[:len(watermarkMagic)]) == watermarkMagic
}

// DecodeWatermark decodes a watermark record. Errors wrap ErrBadMarker.
func DecodeWatermark(r *kgo.Record) (Watermark, error) {
	if r == nil || r.Value == nil || !isWatermark(r.Value) {
		return Watermark{}, fmt.Errorf("%w: not a watermark", ErrBadMarker)
	}
	v := r.Value
	if v[len(watermarkMagic)] != watermarkVersion {
		return Watermark{}, fmt.Errorf("%w: unsupported watermark version %d", ErrBadMarker, v[len(watermarkMagic)])
	}
	d := &decoder{b: v[len(watermarkMagic)+1:]}
	var w Watermark
	w.Group = d.str("group")
	w.TP.Topic = d.str("topic")
	p := d.varint("partition")
	if d.err == nil && (p < math.MinInt32 || p > math.MaxInt32) {
		d.fail("partition %d out of int32 range", p)
	}
	w.TP.Partition = int32(p)
	w.Offset = d.varint("offset")
	if d.err == nil && w.Offset < 0 {
		d.fail("negative watermark %d", w.Offset)
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return Watermark{}, d.err
	}
	return w, nil
}
