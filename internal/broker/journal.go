package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"

	"github.com/weirstream/weir/internal/atomicfile"
)

// What kfake (v0.0.0-20260918054303-01f206a7e32c) writes as it goes, and
// what it writes only at a clean stop, decides what a crash loses:
//
//   - Written as it goes: partition segments and indexes (per batch,
//     without fsync), topics.json on CreateTopics (not on auto-creation),
//     groups.log (classic and consumer groups, committed offsets), pids.log
//     (producer ids, epochs, ends of transactions).
//   - Written only at a clean stop, in session_state.json (which kfake
//     deletes as it loads it): group configs, share-partition state (start
//     offset, per-record state and delivery counts), share-group members and
//     in-progress transactions.
//   - At load after a crash, kfake replays the segments and treats every
//     transaction without a marker as aborted, in memory only, bumping its
//     producer epoch: no marker is written, so a read_committed kgo client
//     keeps skipping that producer's later batches (the same transactional
//     id is wedged), and a later commit marker of that producer makes the
//     orphan's records visible after the next crash. The epoch bump is
//     lost by the next crash if nothing persisted a newer epoch first,
//     which would let the orphan's producer continue it (fenceOrphans).
//
// The journal keeps what Weir needs to repair the rest, next to kfake's
// files: group configs as they are set, and each share partition's start
// offset as acknowledgements advance it.

// journalFile is the repair journal in the data dir.
const journalFile = "weir-broker-journal.json"

// runningFile exists while a broker runs on the dir; a clean Close removes
// it, so finding it at Start means the last run did not stop cleanly.
const runningFile = ".weir-broker.running"

// journal is the content of journalFile.
type journal struct {
	Version int `json:"version"`
	// GroupConfigs are the group-level configs as last set, by group.
	GroupConfigs map[string]map[string]string `json:"group_configs,omitempty"`
	// ShareStart is each share partition's start offset as last observed,
	// by group, topic and partition. It only lags the broker's: every
	// record below it was acknowledged (accepted, rejected or archived).
	ShareStart map[string]map[string]map[int32]int64 `json:"share_start,omitempty"`
}

const journalVersion = 1

func (j *journal) clone() journal {
	c := journal{Version: journalVersion, GroupConfigs: map[string]map[string]string{}, ShareStart: map[string]map[string]map[int32]int64{}}
	for g, m := range j.GroupConfigs {
		c.GroupConfigs[g] = maps.Clone(m)
	}
	for g, ts := range j.ShareStart {
		c.ShareStart[g] = map[string]map[int32]int64{}
		for t, ps := range ts {
			c.ShareStart[g][t] = maps.Clone(ps)
		}
	}
	return c
}

// readJournal loads the journal of dir; a missing file is an empty journal.
func readJournal(dir string) (journal, error) {
	var j journal
	raw, err := os.ReadFile(filepath.Join(dir, journalFile))
	if errors.Is(err, os.ErrNotExist) {
		return j.clone(), nil
	}
	if err != nil {
		return j, fmt.Errorf("read %s: %w", journalFile, err)
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		return j, fmt.Errorf("parse %s: %w", journalFile, err)
	}
	if j.Version > journalVersion {
		return j, fmt.Errorf("%s has version %d, newer than %d", journalFile, j.Version, journalVersion)
	}
	return j.clone(), nil
}

// writeJournal replaces the journal atomically (temp file, fsync, rename).
func writeJournal(dir string, j journal) error {
	raw, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, journalFile), raw)
}
