package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"reflect"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/s3server"
)

// keyedSnapshot is a task snapshot with kgs key groups of size bytes each
// and one operator state entry.
func keyedSnapshot(r *rand.Rand, kgs, size int) TaskSnapshot {
	op := OperatorSnapshot{UID: "counts", Subtask: 0, Parallelism: 1, MaxParallelism: kgs, KeyGroups: map[int][]byte{},
		State: [][]byte{[]byte("offsets")}, Handles: []TxnHandle{{TransactionalID: "t-1", ProducerID: 7, Epoch: 1, Checkpoint: 1}}}
	for kg := range kgs {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		op.KeyGroups[kg] = b
	}
	return TaskSnapshot{Task: "counts#0", Operators: []OperatorSnapshot{op}}
}

func TestSegmentsGoToStorageAndComeBackWhole(t *testing.T) {
	srv, err := s3server.Start(t.Context(), s3server.Buckets("weir"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	s3, err := storage.Open(t.Context(), srv.URL("weir", "cp"), storage.Credentials("weir", "weir"), storage.PartSize(5<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	defer http.DefaultClient.CloseIdleConnections()
	mem, _ := storage.Open(t.Context(), "mem://")
	for name, tc := range map[string]struct {
		st        storage.Storage
		kgs, size int
	}{
		"mem":                {mem, 128, 512},
		"s3 multipart 6 MiB": {s3, 96, 64 << 10}, // above the 5 MiB part size: a multipart upload
	} {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			snap := keyedSnapshot(r, tc.kgs, tc.size)
			w := NewSegmentWriter(tc.st, "job-1", 0)
			out, _, n, err := w.Write(t.Context(), 5, snap, nil)
			if err != nil {
				t.Fatal(err)
			}
			if n != snap.Size() || out.Size() != snap.Size() || out.Uploaded(5) != snap.Size() {
				t.Fatalf("wrote %d bytes, snapshot size %d, acknowledged size %d", n, snap.Size(), out.Size())
			}
			var objs []storage.Object
			_ = tc.st.List(t.Context(), SharedPrefix("job-1"), func(o storage.Object) error { objs = append(objs, o); return nil })
			if len(objs) != 1 || !strings.HasPrefix(objs[0].Key, "job-1/shared/counts_0/5-") || !strings.HasSuffix(objs[0].Key, ".seg") {
				t.Fatalf("objects %v: want one segment job-1/shared/counts_0/5-*.seg", objs)
			}
			op := out.Operators[0]
			if len(op.State) != 0 || len(op.KeyGroups) != 0 || len(op.KeyGroupRefs) != tc.kgs || len(op.StateRefs) != 1 {
				t.Fatalf("acknowledged operator holds %d entries, %d key groups inline, %d/%d by reference", len(op.State), len(op.KeyGroups), len(op.StateRefs), len(op.KeyGroupRefs))
			}
			// The references survive the checkpoint store's encoding.
			c := Completed{Job: "job-1", ID: 5, TriggeredAt: time.Unix(1, 0), CompletedAt: time.Unix(2, 0), Tasks: map[TaskID]TaskSnapshot{out.Task: out}}
			meta, handles, err := encodeCompleted(c)
			if err != nil {
				t.Fatal(err)
			}
			hs, err := decodeHandles(handles, recordFormat, "job-1", 5)
			if err != nil {
				t.Fatal(err)
			}
			back, err := decodeMeta(meta, recordFormat, "job-1", 5, hs)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back.Tasks, c.Tasks) {
				t.Fatal("the checkpoint store's encoding lost references")
			}
			if len(meta) > 64<<10 {
				t.Errorf("the job manager's record of %d bytes of state is %d bytes", snap.Size(), len(meta))
			}
			got, err := Resolve(t.Context(), tc.st, back)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Tasks[snap.Task], snap) {
				t.Fatal("resolved state differs from what was written")
			}
		})
	}
}

func TestASecondCheckpointWithFewChangedKeysUploadsOnlyTheirKeyGroups(t *testing.T) {
	st, _ := storage.Open(t.Context(), "mem://")
	r := rand.New(rand.NewPCG(3, 4))
	snap := keyedSnapshot(r, 128, 1000)
	w := NewSegmentWriter(st, "j", 0)
	_, base, full, err := w.Write(t.Context(), 1, snap, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Three key groups change; one changes back to bytes of its own size.
	next := keyedSnapshot(rand.New(rand.NewPCG(3, 4)), 128, 1000)
	for _, kg := range []int{3, 50, 127} {
		next.Operators[0].KeyGroups[kg] = bytes.Repeat([]byte{byte(kg)}, 1000+kg)
	}
	out, _, n, err := w.Write(t.Context(), 2, next, base)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(len("offsets") + 1003 + 1050 + 1127)
	if n != want || out.Uploaded(2) != want {
		t.Fatalf("second checkpoint wrote %d bytes (acknowledged %d as uploaded), want %d: the 3 changed key groups and the operator state", n, out.Uploaded(2), want)
	}
	if full != snap.Size() || out.Size() != next.Size() {
		t.Fatalf("full size %d/%d, want %d/%d", full, out.Size(), snap.Size(), next.Size())
	}
	for kg, ref := range out.Operators[0].KeyGroupRefs {
		changed := kg == 3 || kg == 50 || kg == 127
		if changed != (ref.Checkpoint == 2) {
			t.Errorf("key group %d: reference of checkpoint %d (changed: %v)", kg, ref.Checkpoint, changed)
		}
	}
	c := Completed{Job: "j", ID: 2, Tasks: map[TaskID]TaskSnapshot{out.Task: out}}
	got, err := Resolve(t.Context(), st, c)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Tasks[next.Task], next) {
		t.Fatal("the incremental checkpoint does not resolve to its state")
	}
	// Without a base everything is written again; a small snapshot stays inline.
	if _, _, n, _ := w.Write(t.Context(), 3, next, nil); n != next.Size() {
		t.Fatalf("without a base: wrote %d, want %d", n, next.Size())
	}
	small := keyedSnapshot(r, 4, 100)
	if out, _, n, _ := w.Write(t.Context(), 4, small, nil); n != 0 || !reflect.DeepEqual(out, small) {
		t.Fatalf("a snapshot below the inline limit wrote %d bytes", n)
	}
}

func TestAMissingOrCorruptSegmentIsOneErrorNamingIt(t *testing.T) {
	st, _ := storage.Open(t.Context(), "mem://")
	out, _, _, err := NewSegmentWriter(st, "j", -1).Write(t.Context(), 1, keyedSnapshot(rand.New(rand.NewPCG(5, 6)), 8, 100), nil)
	if err != nil {
		t.Fatal(err)
	}
	key := out.Operators[0].StateRefs[0].Key
	c := Completed{Job: "j", ID: 1, Tasks: map[TaskID]TaskSnapshot{out.Task: out}}
	if err := st.Put(t.Context(), key, strings.NewReader(strings.Repeat("x", 2000))); err != nil {
		t.Fatal(err)
	}
	if _, err := Resolve(t.Context(), st, c); !errors.Is(err, ErrStateUnreadable) || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "CRC-32C") {
		t.Fatalf("corrupt segment: %v", err)
	}
	if err := st.Put(t.Context(), key, strings.NewReader("short")); err != nil {
		t.Fatal(err)
	}
	if _, err := Resolve(t.Context(), st, c); !errors.Is(err, ErrStateUnreadable) || !strings.Contains(err.Error(), key) {
		t.Fatalf("truncated segment: %v", err)
	}
	_ = st.Delete(t.Context(), key)
	if _, err := Resolve(t.Context(), st, c); !errors.Is(err, ErrStateUnreadable) || !errors.Is(err, storage.ErrNotFound) || !strings.Contains(err.Error(), key) {
		t.Fatalf("missing segment: %v", err)
	}
}

// refsTo is a checkpoint id of job "j" referencing objects written for the
// given checkpoints.
func refsTo(id ID, written ...ID) Completed {
	op := OperatorSnapshot{UID: "op", KeyGroupRefs: map[int]StateRef{}}
	for i, w := range written {
		op.KeyGroupRefs[i] = StateRef{Key: fmt.Sprintf("j/shared/t/%d-x.seg", w), Length: 1, Checkpoint: w}
	}
	return Completed{Job: "j", ID: id, Tasks: map[TaskID]TaskSnapshot{"t": {Task: "t", Operators: []OperatorSnapshot{op}}}}
}

func TestTheRegistryRefusesACheckpointReusingAnObjectRetentionDropped(t *testing.T) {
	reg := NewSharedRegistry("j")
	// Retention keeps 1. Checkpoint 1 writes object 1; checkpoint 2 reuses
	// it and writes object 2; checkpoint 3 changed that key group again.
	for _, c := range []Completed{refsTo(1, 1), refsTo(2, 1, 2), refsTo(3, 3, 2)} {
		if err := reg.Check(c); err != nil {
			t.Fatalf("checkpoint %d: %v", c.ID, err)
		}
		reg.Register(c)
		deleted := reg.Retain([]ID{c.ID})
		if c.ID == 3 && !reflect.DeepEqual(deleted, []string{"j/shared/t/1-x.seg"}) {
			t.Fatalf("after checkpoint 3: deleted %v, want object 1", deleted)
		}
		if c.ID < 3 && len(deleted) != 0 {
			t.Fatalf("after checkpoint %d: deleted %v, still referenced", c.ID, deleted)
		}
	}
	// Checkpoint 4 was snapshotted by a task whose base is still
	// checkpoint 1 (it had not heard that 2 and 3 completed): it reuses
	// object 1, which is deleted. It must not complete.
	err := reg.Check(refsTo(4, 1, 2))
	if !errors.Is(err, ErrStaleReference) || !strings.Contains(err.Error(), "j/shared/t/1-x.seg") {
		t.Fatalf("check of a checkpoint reusing a deleted object: %v", err)
	}
	if err := reg.Check(refsTo(4, 3, 2, 4)); err != nil {
		t.Fatalf("check of a checkpoint reusing live objects: %v", err)
	}
	if err := reg.Check(refsTo(4, 5)); !errors.Is(err, ErrStaleReference) {
		t.Fatalf("a reference to a later checkpoint's object: %v", err)
	}
	// Objects of another job's prefix are never deleted.
	other := refsTo(5, 5)
	other.Tasks["t"].Operators[0].KeyGroupRefs[0] = StateRef{Key: "other/shared/t/5-x.seg", Checkpoint: 5}
	reg.Register(other)
	if deleted := reg.Retain(nil); containsKey(deleted, "other/shared/t/5-x.seg") {
		t.Fatalf("deleted another job's object: %v", deleted)
	}
}

func containsKey(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func TestASavepointRefusesStateThatIsNotInline(t *testing.T) {
	err := WriteSavepoint(t.Context(), t.TempDir(), refsTo(1, 1), time.Now())
	if !errors.Is(err, ErrStateNotInline) {
		t.Fatalf("savepoint of a checkpoint with references: %v", err)
	}
}

// discardStorage takes every Put's body and keeps nothing.
type discardStorage struct{ storage.Storage }

func (discardStorage) Put(_ context.Context, _ string, body io.Reader) error {
	_, err := io.Copy(io.Discard, body)
	return err
}

// A task's segment is uploaded from the snapshot's own key-group blobs:
// writing 32 MiB of state allocates a small fraction of it, not a second
// copy of the snapshot (a heap snapshot's bytes are held once).
func TestASegmentUploadsTheSnapshotsBytesWithoutCopyingThem(t *testing.T) {
	snap := keyedSnapshot(rand.New(rand.NewPCG(3, 4)), 128, 256<<10)
	size := snap.Size()
	w := NewSegmentWriter(discardStorage{}, "job-1", 0)
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	if _, _, _, err := w.Write(t.Context(), 1, snap, nil); err != nil {
		t.Fatal(err)
	}
	goruntime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(size)/8 {
		t.Fatalf("writing a segment of %d bytes allocated %d bytes: want under an eighth (no copy of the state)", size, alloc)
	}
}

// encodedSnapshot is keyedSnapshot's snapshot with its key groups given by
// an Encode that yields each from one reused buffer (as the heap backend
// does), failing with fail after failAfter key groups if fail is set.
func encodedSnapshot(snap TaskSnapshot, fail error, failAfter int) TaskSnapshot {
	op := snap.Operators[0]
	kgs := op.KeyGroups
	op.KeyGroups = nil
	op.Encode = func(yield func(int, []byte) error) error {
		var buf []byte
		for i, kg := range slices.Sorted(maps.Keys(kgs)) {
			if fail != nil && i == failAfter {
				return fail
			}
			buf = append(buf[:0], kgs[kg]...)
			if err := yield(kg, buf); err != nil {
				return err
			}
			clear(buf) // the bytes are the Encode's again
		}
		return nil
	}
	return TaskSnapshot{Task: snap.Task, Operators: []OperatorSnapshot{op}}
}

// Key groups an operator's Encode yields go to the segment as they are
// encoded: the segment reads back as the same bytes (each valid only
// while yielded), written without a copy of the snapshot; a small one
// stays inline with its key groups; an incremental one reuses the key
// groups whose bytes did not change.
func TestEncodedKeyGroupsAreWrittenAsTheyAreEncoded(t *testing.T) {
	st, err := storage.Open(t.Context(), "file://"+t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	plain := keyedSnapshot(rand.New(rand.NewPCG(5, 6)), 64, 64<<10)
	w := NewSegmentWriter(st, "job-1", 0)
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	out, base, n, err := w.Write(t.Context(), 1, encodedSnapshot(plain, nil, 0), nil)
	goruntime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if n != plain.Size() {
		t.Fatalf("%d bytes written, want %d", n, plain.Size())
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(n)/8 {
		t.Errorf("writing %d encoded bytes allocated %d: want under an eighth", n, alloc)
	}
	got, err := Resolve(t.Context(), st, Completed{ID: 1, Tasks: map[TaskID]TaskSnapshot{"counts#0": out}})
	if err != nil {
		t.Fatal(err)
	}
	if g := got.Tasks["counts#0"].Operators[0]; !reflect.DeepEqual(g.KeyGroups, plain.Operators[0].KeyGroups) || !reflect.DeepEqual(g.State, plain.Operators[0].State) {
		t.Fatal("the segment does not read back as the encoded key groups")
	}

	// The next checkpoint changes one key group: only it is written.
	changed := keyedSnapshot(rand.New(rand.NewPCG(5, 6)), 64, 64<<10)
	changed.Operators[0].KeyGroups[7][0]++
	out2, _, n2, err := w.Write(t.Context(), 2, encodedSnapshot(changed, nil, 0), base)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(64<<10 + len("offsets")); n2 != want {
		t.Errorf("incremental checkpoint wrote %d bytes, want %d (one key group and the state entry)", n2, want)
	}
	for kg, r := range out2.Operators[0].KeyGroupRefs {
		if (r.Checkpoint == 2) != (kg == 7) {
			t.Errorf("key group %d refers to checkpoint %d's segment", kg, r.Checkpoint)
		}
	}

	small := keyedSnapshot(rand.New(rand.NewPCG(5, 6)), 4, 100)
	in, _, n, err := w.Write(t.Context(), 3, encodedSnapshot(small, nil, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	if op := in.Operators[0]; n != 0 || op.Encode != nil || len(op.KeyGroupRefs) != 0 || !reflect.DeepEqual(op.KeyGroups, small.Operators[0].KeyGroups) {
		t.Errorf("a %d-byte snapshot: %d bytes written, key groups %d inline and %d referenced; want it inline, whole", small.Size(), n, len(op.KeyGroups), len(op.KeyGroupRefs))
	}
}

// An Encode failing halfway fails the write with its error, and no
// segment is left in storage (no truncated object a restore could read).
func TestAnEncodeFailingHalfwayWritesNoSegment(t *testing.T) {
	st, err := storage.Open(t.Context(), "file://"+t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	errCodec := errors.New("codec broke")
	snap := encodedSnapshot(keyedSnapshot(rand.New(rand.NewPCG(7, 8)), 64, 64<<10), errCodec, 32)
	if _, _, _, err := NewSegmentWriter(st, "job-1", 0).Write(t.Context(), 1, snap, nil); !errors.Is(err, errCodec) {
		t.Fatalf("got %v, want the Encode's error", err)
	}
	var objs []string
	if err := st.List(t.Context(), SharedPrefix("job-1"), func(o storage.Object) error { objs = append(objs, o.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(objs) != 0 {
		t.Fatalf("objects %v left by a failed write", objs)
	}
}
