package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/s3server"
)

// openStorages returns the checkpoint storages the tests run on: memory,
// and the embedded S3 server through the real AWS client.
func openStorages(t *testing.T) map[string]func(t *testing.T) (storage.Storage, string) {
	return map[string]func(t *testing.T) (storage.Storage, string){
		"mem": func(t *testing.T) (storage.Storage, string) {
			st, err := storage.Open(t.Context(), "mem://")
			if err != nil {
				t.Fatal(err)
			}
			return st, "mem://"
		},
		"s3": func(t *testing.T) (storage.Storage, string) {
			srv, err := s3server.Start(t.Context(), s3server.Buckets("weir"))
			if err != nil {
				t.Fatal(err)
			}
			u := srv.URL("weir", "cp")
			st, err := storage.Open(t.Context(), u, storage.Credentials("weir", "weir"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				st.Close()
				srv.Close()
			})
			return st, u
		},
	}
}

// listObjects lists every object of job's shared prefix.
func listObjects(t *testing.T, st storage.Storage, job string) map[string]bool {
	t.Helper()
	objs := map[string]bool{}
	if err := st.List(context.Background(), checkpoint.SharedPrefix(job), func(o storage.Object) error {
		objs[o.Key] = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return objs
}

// referenced are the objects the retained checkpoints of job reference.
func referenced(t *testing.T, store *checkpoint.Store, job string) (map[string]bool, []checkpoint.Completed) {
	t.Helper()
	sums, err := store.List(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	refs := map[string]bool{}
	var cs []checkpoint.Completed
	for _, s := range sums {
		c, err := store.Get(context.Background(), job, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
		for _, r := range c.Refs() {
			refs[r.Key] = true
		}
	}
	return refs, cs
}

// memStores opens a memory checkpoint storage and a checkpoint store in a
// temporary directory, closed with the test.
func memStores(t *testing.T) (storage.Storage, *checkpoint.Store) {
	t.Helper()
	st, err := storage.Open(t.Context(), "mem://")
	if err != nil {
		t.Fatal(err)
	}
	store, err := checkpoint.OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return st, store
}

// checkOnlyReferencedObjects fails unless the objects under the seq job's
// shared prefix are exactly those its retained checkpoints reference, and
// returns them.
func checkOnlyReferencedObjects(t *testing.T, st storage.Storage, store *checkpoint.Store) map[string]bool {
	t.Helper()
	objs := listObjects(t, st, "seq")
	refs, _ := referenced(t, store, "seq")
	for k := range objs {
		if !refs[k] {
			t.Errorf("object %s is referenced by no retained checkpoint", k)
		}
	}
	for k := range refs {
		if !objs[k] {
			t.Errorf("retained checkpoints reference %s, which is gone", k)
		}
	}
	return objs
}

// runSeqUntilCanceled runs the seq job (its source stalled after stallAt
// records) on mc until ctx is cancelled, which it must end with.
func runSeqUntilCanceled(t *testing.T, ctx context.Context, mc *MiniCluster, stallAt int) {
	t.Helper()
	src := seqSourceOf(seqSource{keys: 30, splits: 6, n: 400, perPoll: 1, stallAt: stallAt})
	if _, err := mc.Run(ctx, seqJob(src, &violations{}, newMemTxns(), nil, 2, 2)); !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v, want it cancelled", err)
	}
}

func TestStateInCheckpointStorageIsExactlyOnceUnderFailuresAndLeavesNoUnreferencedObject(t *testing.T) {
	seeds := 6
	if testing.Short() {
		seeds = 2
	}
	for name, open := range openStorages(t) {
		for seed := int64(1); seed <= int64(seeds); seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", name, seed), func(t *testing.T) {
				st, u := open(t)
				store, err := checkpoint.OpenStore(t.TempDir())
				if err != nil {
					t.Fatal(err)
				}
				defer store.Close()
				var mu sync.Mutex
				var sizes, uploaded int64
				runUnderRandomFailures(t, seed, 1, func(*Job) []ClusterOpt {
					return []ClusterOpt{CheckpointStore(store), StateStorage(st, u), StateInlineLimit(-1), OrphanGrace(0),
						OnCheckpointComplete(func(e CheckpointEvent) {
							mu.Lock()
							sizes, uploaded = sizes+e.Size, uploaded+e.Uploaded
							mu.Unlock()
						})}
				})
				_, cs := referenced(t, store, "seq")
				if len(cs) == 0 {
					t.Fatal("no retained checkpoint")
				}
				for _, c := range cs {
					for task, ts := range c.Tasks {
						for _, op := range ts.Operators {
							if len(op.State) > 0 || len(op.KeyGroups) > 0 {
								t.Fatalf("checkpoint %d task %s operator %s carries state bytes: the job master must hold references only", c.ID, task, op.UID)
							}
						}
					}
				}
				objs := checkOnlyReferencedObjects(t, st, store)
				t.Logf("%d objects, state %d bytes acknowledged, %d uploaded", len(objs), sizes, uploaded)
			})
		}
	}
}

// stoppedRun runs the seq job stalled halfway until n checkpoints
// completed, against store and st.
func stoppedRun(t *testing.T, store *checkpoint.Store, st storage.Storage, u string, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var completed int
	mc := NewMiniCluster(CheckpointStore(store), StateStorage(st, u), StateInlineLimit(-1), CheckpointInterval(5*time.Millisecond),
		OnCheckpointComplete(func(CheckpointEvent) {
			if completed++; completed == n {
				cancel()
			}
		}))
	runSeqUntilCanceled(t, ctx, mc, 200)
}

func TestARestoreFromAMissingOrCorruptSegmentFailsNamingTheObject(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, st storage.Storage, key string)
		want   string
	}{
		{"missing", func(t *testing.T, st storage.Storage, key string) {
			if err := st.Delete(t.Context(), key); err != nil {
				t.Fatal(err)
			}
		}, "not found"},
		{"corrupt", func(t *testing.T, st storage.Storage, key string) {
			rc, err := st.Open(t.Context(), key, 0, -1)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			for i := range body {
				body[i] ^= 0xff
			}
			if err := st.Put(t.Context(), key, bytes.NewReader(body)); err != nil {
				t.Fatal(err)
			}
		}, "CRC-32C"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, store := memStores(t)
			stoppedRun(t, store, st, "mem://", 3)
			c, err := store.Latest(t.Context(), "seq")
			if err != nil {
				t.Fatal(err)
			}
			refs := c.Refs()
			if len(refs) == 0 {
				t.Fatal("the checkpoint references no object")
			}
			key := refs[0].Key
			tc.damage(t, st, key)
			mc := NewMiniCluster(CheckpointStore(store), StateStorage(st, "mem://"), CheckpointInterval(5*time.Millisecond), Restarts(0, 0))
			src := seqSourceOf(seqSource{keys: 30, splits: 6, n: 400, perPoll: 1})
			_, err = mc.Run(t.Context(), seqJob(src, &violations{}, newMemTxns(), nil, 2, 2))
			if !errors.Is(err, checkpoint.ErrStateUnreadable) || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("restore error = %v; want ErrStateUnreadable naming %s (%s)", err, key, tc.want)
			}
		})
	}
}

func TestATaskStartsAFullUploadAfterAnAbortedCheckpoint(t *testing.T) {
	st, err := storage.Open(t.Context(), "mem://")
	if err != nil {
		t.Fatal(err)
	}
	w := newStateWriter(DeploySpec{JobID: "j", Storage: st, InlineLimit: -1}, zap.NewNop())
	snap := checkpoint.TaskSnapshot{Task: "t", Operators: []checkpoint.OperatorSnapshot{{UID: "op", KeyGroups: map[int][]byte{0: []byte("zero"), 1: []byte("one")}}}}
	ack := func(id checkpoint.ID) checkpoint.TaskSnapshot {
		var got checkpoint.TaskSnapshot
		w.write(t.Context(), "t", id, snap, func(s checkpoint.TaskSnapshot) { got = s }, func(err error) { t.Fatal(err) })
		w.wait()
		return got
	}
	if s := ack(1); s.Uploaded(1) != 7 {
		t.Fatalf("first checkpoint uploaded %d bytes, want 7", s.Uploaded(1))
	}
	w.notify(1, true)
	if s := ack(2); s.Uploaded(2) != 0 {
		t.Fatalf("unchanged state after a confirmed checkpoint uploaded %d bytes, want 0", s.Uploaded(2))
	}
	w.notify(2, false) // aborted: maybe a reused object was refused
	if s := ack(3); s.Uploaded(3) != 7 {
		t.Fatalf("the checkpoint after an abort uploaded %d bytes, want all 7", s.Uploaded(3))
	}
}

func TestCheckpointsOfUnchangedKeyGroupsUploadOnlyWhatChanged(t *testing.T) {
	st, store := memStores(t)
	// The source stalls halfway: checkpoints after the stall find every
	// key group as the previous one left it.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var mu sync.Mutex
	var events []CheckpointEvent
	mc := NewMiniCluster(CheckpointStore(store), StateStorage(st, "mem://"), StateInlineLimit(-1), CheckpointInterval(5*time.Millisecond),
		OnCheckpointComplete(func(e CheckpointEvent) {
			mu.Lock()
			defer mu.Unlock()
			if events = append(events, e); len(events) == 30 {
				cancel()
			}
		}))
	runSeqUntilCanceled(t, ctx, mc, 50)
	last := events[len(events)-1]
	c, err := store.Get(t.Context(), "seq", last.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The last checkpoint: the checker's and the sink's state unchanged
	// (reused), only what changes at every checkpoint written: the
	// source's entries and the sink's pending transaction.
	var reused, fresh int64
	for _, r := range c.Refs() {
		if r.Checkpoint == c.ID {
			fresh += r.Length
		} else {
			reused += r.Length
		}
	}
	if reused == 0 || last.Uploaded != fresh || last.Size != fresh+reused {
		t.Fatalf("checkpoint %d: size %d, uploaded %d; references: %d bytes written for it, %d reused", c.ID, last.Size, last.Uploaded, fresh, reused)
	}
	checked := 0
	for _, ts := range c.Tasks {
		for _, op := range ts.Operators {
			for kg, r := range op.KeyGroupRefs {
				checked++
				if r.Checkpoint == c.ID {
					t.Errorf("key group %d of %s was written again though no key changed", kg, op.UID)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("the checkpoint holds no keyed state by reference")
	}
	t.Logf("checkpoint %d: %d bytes, %d uploaded", c.ID, last.Size, last.Uploaded)
}

func TestAJobMasterStartingAgainRebuildsItsRegistryAndSweepsOnlyOrphans(t *testing.T) {
	st, store := memStores(t)
	stoppedRun(t, store, st, "mem://", 4)
	// An object a task wrote and never acknowledged (it died), and one of
	// another job.
	orphan := checkpoint.SharedPrefix("seq") + "gone_0/99-0000000000000000.seg"
	other := checkpoint.SharedPrefix("other") + "t_0/1-0000000000000000.seg"
	for _, k := range []string{orphan, other} {
		if err := st.Put(t.Context(), k, strings.NewReader("bytes")); err != nil {
			t.Fatal(err)
		}
	}
	// A new job master (a restarted or failed-over job manager) on the same
	// stores: it knows the retained checkpoints' objects before it deletes
	// anything, restores from them, and sweeps the orphan.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var restored checkpoint.ID
	mc := NewMiniCluster(CheckpointStore(store), StateStorage(st, "mem://"), StateInlineLimit(-1), CheckpointInterval(5*time.Millisecond),
		OrphanGrace(0), OnRestore(func(_ int, from checkpoint.ID) { restored = from }),
		OnCheckpointComplete(func(e CheckpointEvent) {
			if e.ID > restored+2 {
				cancel()
			}
		}))
	runSeqUntilCanceled(t, ctx, mc, 200)
	if restored == 0 {
		t.Fatal("the second run restored nothing")
	}
	if objs := checkOnlyReferencedObjects(t, st, store); objs[orphan] {
		t.Errorf("the orphan %s was not swept", orphan)
	}
	if len(listObjects(t, st, "other")) != 1 {
		t.Error("the sweep deleted another job's object")
	}
}

func TestAJobCancelledWithACheckpointInFlightLeavesNoObjectOfIt(t *testing.T) {
	st, store := memStores(t)
	// The job is cancelled when a task acknowledges a checkpoint (the 4th
	// or later) with an object written for it; that acknowledgement reaches
	// the coordinator only after the coordinator stopped, so the checkpoint
	// never completes.
	// The default orphan grace (10 minutes) keeps the sweep away from the
	// object: only the job master's end deletes it.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var once sync.Once
	var inFlight checkpoint.ID
	mc := NewMiniCluster(CheckpointStore(store), StateStorage(st, "mem://"), StateInlineLimit(-1), CheckpointInterval(5*time.Millisecond),
		OnCheckpointAck(func(a CheckpointAck) {
			if a.ID >= 4 && a.Uploaded > 0 {
				once.Do(func() {
					inFlight = a.ID
					cancel()
					time.Sleep(200 * time.Millisecond) // the coordinator stops meanwhile
				})
			}
		}))
	runSeqUntilCanceled(t, ctx, mc, 200)
	latest, err := store.Latest(t.Context(), "seq")
	if err != nil {
		t.Fatal(err)
	}
	if inFlight == 0 || latest.ID >= inFlight {
		t.Fatalf("latest checkpoint %d: the acknowledgement held back did not keep checkpoint %d in flight", latest.ID, inFlight)
	}
	checkOnlyReferencedObjects(t, st, store)
}

// listFailing is a checkpoint store that cannot list its checkpoints.
type listFailing struct{ *checkpoint.Store }

func (listFailing) List(context.Context, string) ([]checkpoint.Summary, error) {
	return nil, errors.New("list: injected failure")
}

func TestNothingIsDeletedWhileTheRetainedCheckpointsReferencesAreUnknown(t *testing.T) {
	st, store := memStores(t)
	stoppedRun(t, store, st, "mem://", 3)
	orphan := checkpoint.SharedPrefix("seq") + "gone_0/99-0000000000000000.seg"
	if err := st.Put(t.Context(), orphan, strings.NewReader("bytes")); err != nil {
		t.Fatal(err)
	}
	before := listObjects(t, st, "seq")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	completed := 0
	mc := NewMiniCluster(CheckpointStore(listFailing{store}), StateStorage(st, "mem://"), StateInlineLimit(-1),
		CheckpointInterval(5*time.Millisecond), OrphanGrace(0),
		OnCheckpointComplete(func(CheckpointEvent) {
			if completed++; completed == 5 {
				cancel()
			}
		}))
	runSeqUntilCanceled(t, ctx, mc, 300)
	after := listObjects(t, st, "seq")
	for k := range before {
		if !after[k] {
			t.Errorf("%s was deleted though the job master could not learn what the retained checkpoints reference", k)
		}
	}
}
