package sharegroup

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// checkpointOf snapshots s at id and completes it.
func checkpointOf(t *testing.T, s *Source[string], id checkpoint.ID) runtime.OperatorState {
	t.Helper()
	st, err := s.Snapshot(context.Background(), id)
	if err != nil {
		t.Fatalf("snapshot %d: %v", id, err)
	}
	if err := s.NotifyCheckpointComplete(context.Background(), id); err != nil {
		t.Fatalf("complete %d: %v", id, err)
	}
	return st
}

// verifyRestore asks a fresh source of newSrc whether checkpoint id's
// state st can be restored.
func verifyRestore(t *testing.T, newSrc func() runtime.Source[string], id checkpoint.ID, st runtime.OperatorState) error {
	t.Helper()
	return newSrc().(runtime.RestoreVerifier).VerifyRestore(t.Context(),
		runtime.RestoredOperator{Job: "next", UID: "src", Checkpoint: id, Entries: st.Entries, Handles: st.Handles})
}

// The lineage position closes the blind spots of a check that only knew
// the restored markers: a checkpoint whose epoch acknowledged nothing (no
// marker, no handle) carries the position forward, so restoring it is
// refused once a later checkpoint's acknowledgements committed, also after
// their marker was tombstoned and compaction removed it; while it is the
// latest it restores. Re-queue markers (checkpoint 0) and state without a
// position (an older Weir) are not judged.
func TestASavepointOfAnIdleEpochIsRefusedOnceLaterAcknowledgementsCommitted(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 10)
	newSrc := testSources(t, env, MarkerGrace(time.Millisecond),
		withCfg(func(c *cfg) { c.tombstoneEvery, c.checkEvery = 20*time.Millisecond, 20*time.Millisecond }))
	s, err := openFrom(t, newSrc, 0, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := pollFor(t, s, 10, 10*time.Second); len(got) != 10 {
		t.Fatalf("got %d records, want 10", len(got))
	}
	busy := checkpointOf(t, s, 1)
	idle := checkpointOf(t, s, 2) // nothing read in its epoch
	if len(idle.Handles) != 0 || len(idle.Entries) != 1 {
		t.Fatalf("idle checkpoint: %d handles, %d entries; want no handle and the lineage position", len(idle.Handles), len(idle.Entries))
	}
	if err := verifyRestore(t, newSrc, 2, idle); err != nil {
		t.Fatalf("restoring the latest checkpoint (an idle epoch's): %v", err)
	}
	if err := verifyRestore(t, newSrc, 1, busy); err != nil {
		t.Fatalf("restoring checkpoint 1, whose epoch's acknowledgements are the latest: %v", err)
	}

	produceN(t, env, "in", 5)
	if got := pollFor(t, s, 5, 10*time.Second); len(got) != 5 {
		t.Fatalf("got %d records, want 5", len(got))
	}
	later := checkpointOf(t, s, 3)
	refused := func(what string, id checkpoint.ID, st runtime.OperatorState) {
		t.Helper()
		err := verifyRestore(t, newSrc, id, st)
		if !errors.Is(err, ErrRestoreBehindAcks) || !errors.Is(err, runtime.ErrUnrecoverable) ||
			!strings.Contains(err.Error(), "checkpoint 3 of ") || !strings.Contains(err.Error(), "restore the latest savepoint") {
			t.Fatalf("%s: %v; want ErrRestoreBehindAcks naming checkpoint 3, unrecoverable", what, err)
		}
	}
	refused("the idle checkpoint after later acknowledgements", 2, idle)
	refused("checkpoint 1 after later acknowledgements", 1, busy)
	if err := verifyRestore(t, newSrc, 3, later); err != nil {
		t.Fatalf("restoring the latest checkpoint: %v", err)
	}
	if err := verifyRestore(t, newSrc, 2, runtime.OperatorState{}); err != nil {
		t.Fatalf("state without a position or handles (an older Weir's): %v, want it not judged", err)
	}

	// Once checkpoint 3's marker is tombstoned (its records are done, the
	// grace period passed), and compaction removed it, the tombstone still
	// names it.
	live := func() int {
		ix, err := acklog.NewIndex(t.Context(), []string{env.Addr}, acklog.TopicFor("g"))
		if err != nil {
			t.Fatal(err)
		}
		defer ix.Close()
		if err := ix.CatchUpToEnd(t.Context()); err != nil {
			t.Fatal(err)
		}
		return ix.Len()
	}
	deadline := time.Now().Add(10 * time.Second)
	for live() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the markers were never tombstoned")
		}
		pollFor(t, s, 1, 50*time.Millisecond) // subtask 0 collects while polling
	}
	refused("the idle checkpoint after the later marker was tombstoned", 2, idle)
	produceN(t, env, "in", 1) // compaction keeps the last batch of the ack-log
	pollFor(t, s, 1, 10*time.Second)
	checkpointOf(t, s, 4)
	env.Broker.Cluster().Compact()
	refused("the idle checkpoint after compaction", 2, idle)
}

// A lineage position reads back as written; anything else is refused
// (errBadLineage), never misread: a later format says so.
func TestLineagePositionEncoding(t *testing.T) {
	for _, l := range []lineage{{Below: 0}, {Below: 41, Prefix: "weir-job-src"}, {Below: 1 << 50, Prefix: "x"}} {
		got, err := decodeLineage(l.encode())
		if err != nil || got != l {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", l, got, err)
		}
	}
	good := lineage{Below: 7, Prefix: "p"}.encode()
	later := append([]byte(lineageMagic), lineageVersion+1)
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "not a lineage position"},
		{"foreign", []byte("WAK\x01abc"), "not a lineage position"},
		{"later version", later, "written by a later Weir"},
		{"truncated", good[:len(good)-1], "truncated"},
		{"trailing", append(good[:len(good):len(good)], 0), "trailing"},
		{"no position", []byte(lineageMagic + "\x01"), "truncated position"},
	} {
		if _, err := decodeLineage(tc.b); !errors.Is(err, errBadLineage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want errBadLineage saying %q", tc.name, err, tc.want)
		}
	}
}
