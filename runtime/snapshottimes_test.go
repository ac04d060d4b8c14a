package runtime

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
)

// slowSnapshotSink discards records and takes delay to snapshot: a
// synchronous part of known length.
type slowSnapshotSink struct{ delay time.Duration }

func (*slowSnapshotSink) Open(context.Context, *OperatorContext) error { return nil }
func (*slowSnapshotSink) Write(context.Context, seqRec) error          { return nil }
func (s *slowSnapshotSink) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	time.Sleep(s.delay)
	return OperatorState{}, nil
}
func (*slowSnapshotSink) Close() error { return nil }

// slowWrites is checkpoint storage whose writes take delay: an
// asynchronous part of known length.
type slowWrites struct {
	storage.Storage
	delay time.Duration
}

func (s slowWrites) Put(ctx context.Context, key string, body io.Reader) error {
	time.Sleep(s.delay)
	return s.Storage.Put(ctx, key, body)
}

func (s slowWrites) Create(ctx context.Context, key string, body io.Reader) error {
	time.Sleep(s.delay)
	return s.Storage.Create(ctx, key, body)
}

func TestAcknowledgementsCarryTheSnapshotsSyncAndAsyncDurations(t *testing.T) {
	const syncDelay, asyncDelay = 30 * time.Millisecond, 40 * time.Millisecond
	st, store := memStores(t)
	var mu sync.Mutex
	var acks []CheckpointAck
	triggered := map[checkpoint.ID]time.Time{}
	mc := NewMiniCluster(CheckpointStore(store), StateStorage(slowWrites{st, asyncDelay}, "mem://"), StateInlineLimit(-1),
		CheckpointInterval(20*time.Millisecond),
		OnCheckpointTriggered(func(ev CheckpointEvent) {
			mu.Lock()
			defer mu.Unlock()
			triggered[ev.ID] = ev.Triggered
		}),
		OnCheckpointAck(func(a CheckpointAck) {
			mu.Lock()
			defer mu.Unlock()
			acks = append(acks, a)
		}))
	src := seqSourceOf(seqSource{keys: 10, splits: 2, n: 300, perPoll: 1, pollDelay: time.Millisecond})
	j := seqJobTo(src, &violations{}, func() Sink[seqRec] { return &slowSnapshotSink{delay: syncDelay} }, 2, 2)
	if _, err := mc.Run(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(acks) == 0 {
		t.Fatal("no acknowledgement")
	}
	slowSync, slowAsync := 0, 0
	for _, a := range acks {
		if a.Sync < 0 || a.Async < 0 {
			t.Errorf("checkpoint %d task %s: sync %v, async %v: negative", a.ID, a.Task, a.Sync, a.Async)
		}
		if trig, ok := triggered[a.ID]; ok && a.Alignment+a.Sync+a.Async > a.At.Sub(trig) {
			t.Errorf("checkpoint %d task %s: alignment %v + sync %v + async %v exceed the %v from trigger to ack",
				a.ID, a.Task, a.Alignment, a.Sync, a.Async, a.At.Sub(trig))
		}
		// A task that uploads writes to the slow storage (nothing stays
		// inline); a task whose state did not change since its last
		// checkpoint references what it uploaded then and writes nothing.
		// Only the tasks with the sink snapshot slowly.
		switch {
		case a.Uploaded == 0:
		case a.Async < asyncDelay:
			t.Errorf("checkpoint %d task %s: async %v, want at least the storage write's %v (size %d, uploaded %d)", a.ID, a.Task, a.Async, asyncDelay, a.Size, a.Uploaded)
		default:
			slowAsync++
		}
		if strings.HasPrefix(string(a.Task), "source#") {
			continue
		}
		if a.Sync < syncDelay {
			t.Errorf("checkpoint %d task %s (with the sink): sync %v, want at least the sink's snapshot's %v", a.ID, a.Task, a.Sync, syncDelay)
		} else {
			slowSync++
		}
	}
	if slowSync == 0 || slowAsync == 0 {
		t.Errorf("of %d acknowledgements, %d took the sink's %v to snapshot and %d the storage's %v to write: want some of each",
			len(acks), slowSync, syncDelay, slowAsync, asyncDelay)
	}
}

// A checkpoint triggered once a source had run out of input says so: its
// barriers follow that source's final watermark, so its cycle includes the
// drain. The checkpoints of the running job do not; the final one does.
func TestCheckpointsTriggeredAfterASourceEndedSaySo(t *testing.T) {
	_, store := memStores(t)
	var mu sync.Mutex
	var done []CheckpointEvent
	mc := NewMiniCluster(CheckpointStore(store), CheckpointInterval(20*time.Millisecond),
		OnCheckpointComplete(func(ev CheckpointEvent) {
			mu.Lock()
			defer mu.Unlock()
			done = append(done, ev)
		}))
	src := seqSourceOf(seqSource{keys: 10, splits: 2, n: 200, perPoll: 1, pollDelay: time.Millisecond})
	if _, err := mc.Run(t.Context(), seqJob(src, &violations{}, newMemTxns(), nil, 2, 2)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(done) < 2 {
		t.Fatalf("%d completed checkpoints, want some while the sources ran and the final one", len(done))
	}
	if last := done[len(done)-1]; !last.AfterSourceEnd {
		t.Errorf("the final checkpoint %d: AfterSourceEnd false, want true (triggered once every source ended)", last.ID)
	}
	if first := done[0]; first.AfterSourceEnd {
		t.Errorf("checkpoint %d, the first of %d: AfterSourceEnd true, want false (the sources run for 100 polls each)", first.ID, len(done))
	}
	for i := 1; i < len(done); i++ {
		if done[i-1].AfterSourceEnd && !done[i].AfterSourceEnd {
			t.Errorf("checkpoint %d after a source ended, %d after it not: a source does not start again", done[i-1].ID, done[i].ID)
		}
	}
}
