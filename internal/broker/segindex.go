package broker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"

	"github.com/weirstream/weir/internal/atomicfile"
)

// Segment indexes after a kill.
//
// kfake stores each partition segment as <base>.dat (Kafka record batches,
// one after the other) and <base>.idx, one fixed-size entry per batch, in
// the same order, carrying what the batch header does not: chiefly whether
// a data batch was produced in a transaction. It appends a batch to the
// .dat and then its entry to the .idx, in two writes. A kill between them
// leaves the index one entry short. kfake loads that batch without its
// entry (not transactional) and appends the next batches' entries one slot
// early, so from then on every later batch of the segment is loaded with
// its successor's flags: a transaction's data batch loaded as not
// transactional is not hidden by its abort marker, and read_committed
// readers see the aborted records (found by the broker crash test as
// duplicates: records the broker had lost and Weir re-committed became
// visible twice).
//
// So at every unclean start, before kfake loads the data dir,
// reconcileSegmentIndexes rebuilds each segment index whose entries do not
// match its batches, from the batches. This writes kfake's index format
// (kfake's persist.go, currentPersistVersion 1): it is pinned by
// TestReconcileReproducesKfakesOwnIndexes, which fails if a kfake upgrade
// changes the format.

const (
	idxEntrySize = 15 // version, crc byte, epoch (4, LE), max earlier timestamp (8, LE), flags
	idxVersion   = 1
	idxFlagInTx  = 1

	batchHeaderSize = 61 // Kafka record batch v2 header, up to and including the record count
	attrTxn         = 0x10
	attrControl     = 0x20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// reconcileSegmentIndexes rebuilds the segment indexes under dataDir that do
// not hold exactly one matching entry per batch, and returns the segments
// it rebuilt ("topic-partition/base.idx").
func reconcileSegmentIndexes(dataDir string) ([]string, error) {
	dats, err := filepath.Glob(filepath.Join(dataDir, "partitions", "*", "*.dat"))
	if err != nil {
		return nil, err
	}
	var rebuilt []string
	for _, dat := range dats {
		idx := strings.TrimSuffix(dat, ".dat") + ".idx"
		want, err := indexFor(dat)
		if err != nil {
			return rebuilt, err
		}
		have, err := os.ReadFile(idx)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return rebuilt, fmt.Errorf("read segment index %s: %w", idx, err)
		}
		if indexMatches(have, want) {
			continue
		}
		if err := atomicfile.Write(idx, want); err != nil {
			return rebuilt, fmt.Errorf("rebuild segment index %s: %w", idx, err)
		}
		rel, _ := filepath.Rel(filepath.Join(dataDir, "partitions"), idx)
		rebuilt = append(rebuilt, rel)
	}
	return rebuilt, nil
}

// indexFor returns the index entries of the batches of segment file dat, up
// to its first incomplete or corrupt batch (where kfake stops loading it).
func indexFor(dat string) ([]byte, error) {
	raw, err := os.ReadFile(dat)
	if err != nil {
		return nil, fmt.Errorf("read segment %s: %w", dat, err)
	}
	var out []byte
	for pos := 0; pos+batchHeaderSize <= len(raw); {
		n := int(int32(binary.BigEndian.Uint32(raw[pos+8:])))
		end := pos + 12 + n
		if n < batchHeaderSize-12 || end > len(raw) ||
			crc32.Checksum(raw[pos+21:end], castagnoli) != binary.BigEndian.Uint32(raw[pos+17:]) {
			break
		}
		epoch := binary.BigEndian.Uint32(raw[pos+12:])
		attrs := binary.BigEndian.Uint16(raw[pos+21:])
		maxTS := binary.BigEndian.Uint64(raw[pos+35:])
		var e [idxEntrySize]byte
		e[0] = idxVersion
		binary.LittleEndian.PutUint32(e[2:6], epoch)
		binary.LittleEndian.PutUint64(e[6:14], maxTS) // kfake recomputes it at load
		if attrs&attrTxn != 0 && attrs&attrControl == 0 {
			e[14] = idxFlagInTx
		}
		e[1] = byte(crc32.Checksum(e[2:], castagnoli))
		out = append(out, e[:]...)
		pos = end
	}
	return out, nil
}

// indexMatches reports whether have holds the entries of want, comparing
// what kfake reads from an entry other than the timestamp (which it
// recomputes): the epoch and the flags.
func indexMatches(have, want []byte) bool {
	if len(have) != len(want) {
		return false
	}
	for i := 0; i < len(want); i += idxEntrySize {
		h, w := have[i:i+idxEntrySize], want[i:i+idxEntrySize]
		if byte(crc32.Checksum(h[2:], castagnoli)) != h[1] ||
			binary.LittleEndian.Uint32(h[2:6]) != binary.LittleEndian.Uint32(w[2:6]) || h[14] != w[14] {
			return false
		}
	}
	return true
}
