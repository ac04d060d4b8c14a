package kafka

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf16"
)

// ErrNotOffsets is wrapped by DecodeOffsets's error for an operator state
// entry that is not a Kafka source's.
var ErrNotOffsets = errors.New("not a kafka source offset entry")

// PartitionOffset is one partition's position in a source's operator state:
// Offset is the next record to read (Kafka's committed-offset convention).
type PartitionOffset struct {
	Topic     string
	Partition int32
	Offset    int64
}

// entryMagic starts every operator state entry of the source (version 1).
var entryMagic = []byte("wkafka1")

// encodeOffset is the operator state entry of one partition's position.
func encodeOffset(p PartitionOffset) []byte {
	b := make([]byte, 0, len(entryMagic)+len(p.Topic)+16)
	b = append(b, entryMagic...)
	b = binary.AppendUvarint(b, uint64(len(p.Topic)))
	b = append(b, p.Topic...)
	b = binary.AppendVarint(b, int64(p.Partition))
	b = binary.AppendVarint(b, p.Offset)
	return b
}

// DecodeOffsets decodes an operator state entry of a Kafka source (what a
// savepoint holds for its UID): the partitions and their offsets. An entry
// of another operator gives an error wrapping ErrNotOffsets.
func DecodeOffsets(entry []byte) ([]PartitionOffset, error) {
	if len(entry) < len(entryMagic) || string(entry[:len(entryMagic)]) != string(entryMagic) {
		return nil, ErrNotOffsets
	}
	b := entry[len(entryMagic):]
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		return nil, fmt.Errorf("%w: bad topic length", ErrNotOffsets)
	}
	topic := string(b[k : k+int(n)])
	b = b[k+int(n):]
	part, k := binary.Varint(b)
	if k <= 0 || part < 0 || part > 1<<31-1 {
		return nil, fmt.Errorf("%w: bad partition", ErrNotOffsets)
	}
	b = b[k:]
	off, k := binary.Varint(b)
	if k <= 0 || k != len(b) || off < 0 {
		return nil, fmt.Errorf("%w: bad offset", ErrNotOffsets)
	}
	return []PartitionOffset{{Topic: topic, Partition: int32(part), Offset: off}}, nil
}

// Owner is the subtask (of parallelism) that reads a topic's partition:
// Flink's KafkaSource rule, so that a topic's partitions are spread over
// consecutive subtasks from a start index its name gives (Java's
// String.hashCode of topic, times 31, modulo parallelism). It depends only
// on the topic, the partition and the parallelism, so every subtask knows
// every partition's owner without asking anyone, and a rescale moves
// partitions deterministically.
func Owner(topic string, partition int32, parallelism int) int {
	if parallelism <= 1 {
		return 0
	}
	var h int32
	for _, u := range utf16.Encode([]rune(topic)) {
		h = 31*h + int32(u)
	}
	start := int((h*31)&0x7FFFFFFF) % parallelism
	return (start + int(partition)) % parallelism
}
