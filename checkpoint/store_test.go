package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testCheckpoint builds a deterministic checkpoint of job with id: three
// tasks with operator state, keyed state and transaction handles.
func testCheckpoint(job string, id ID) Completed {
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).Add(time.Duration(id) * time.Second)
	c := Completed{
		Job:         job,
		ID:          id,
		TriggeredAt: base,
		CompletedAt: base.Add(time.Duration(id)*time.Millisecond + 7),
		Tasks:       map[TaskID]TaskSnapshot{},
		Stats:       map[TaskID]TaskStats{},
	}
	for i, name := range []TaskID{"source#0", "map#0", "sink#0"} {
		ops := []OperatorSnapshot{{
			UID:            fmt.Sprintf("uid-%s", name),
			Subtask:        0,
			Parallelism:    1,
			MaxParallelism: 128,
			State:          [][]byte{[]byte(fmt.Sprintf("%s@%d", name, id)), {byte(id), 0, 0xff}},
			KeyGroups:      map[int][]byte{i: []byte(strings.Repeat("k", int(id)%17+1)), 127: {byte(i)}},
		}}
		if name != "map#0" {
			ops[0].Handles = []TxnHandle{{
				TransactionalID: fmt.Sprintf("%s-%s", job, name),
				ProducerID:      int64(1000*i) + int64(id),
				Epoch:           int16(id % 300),
				Checkpoint:      id,
			}}
			if name == "source#0" && id%2 == 1 { // odd ids: handles with partitions
				ops[0].Handles[0].Partitions = []TxnPartition{{Topic: "out", Partition: 3, FirstOffset: int64(id) * 10}, {Topic: "acks", Partition: 0}}
			}
			if name == "source#0" { // a source's watermark, negative on even ids
				wm := int64(id) * 1_000
				if id%2 == 0 {
					wm = -wm
				}
				ops[0].Watermark = &wm
			}
		}
		if name == "sink#0" {
			// A second operator without handles or state, chained after the first.
			ops = append(ops, OperatorSnapshot{UID: "uid-sink-chained", Subtask: 0, Parallelism: 1})
		}
		c.Tasks[name] = TaskSnapshot{Task: name, Operators: ops}
		c.Stats[name] = TaskStats{AckLatency: time.Duration(i+1) * time.Millisecond, Alignment: time.Duration(id), Size: c.Tasks[name].Size()}
	}
	return c
}

func mustOpen(t testing.TB, dir string, opts ...StoreOpt) *Store {
	t.Helper()
	s, err := OpenStore(dir, opts...)
	if err != nil {
		t.Fatalf("OpenStore(%q): %v", dir, err)
	}
	return s
}

func mustClose(t testing.TB, s *Store) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func assertCheckpoint(t testing.TB, got Completed, want Completed) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("checkpoint %d of %q differs from what was saved:\n got %+v\nwant %+v", got.ID, got.Job, got, want)
	}
}

func listIDs(sums []Summary) []ID {
	ids := make([]ID, len(sums))
	for i, s := range sums {
		ids[i] = s.ID
	}
	return ids
}

func TestStoreRoundTripSurvivesReopenAndRetainsLastN(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "store")
	s := mustOpen(t, dir, WithRetained(3))
	for id := ID(1); id <= 5; id++ {
		if err := s.Save(ctx, testCheckpoint("job-a", id)); err != nil {
			t.Fatalf("Save(%d): %v", id, err)
		}
	}
	// Another job whose name extends the first: must not be touched by its
	// retention or listed with it.
	if err := s.Save(ctx, testCheckpoint("job-a/b", 1)); err != nil {
		t.Fatal(err)
	}
	mustClose(t, s)

	s = mustOpen(t, dir, WithRetained(3))
	defer mustClose(t, s)

	got, err := s.Latest(ctx, "job-a")
	if err != nil {
		t.Fatalf("Latest: %v", err)
	}
	assertCheckpoint(t, got, testCheckpoint("job-a", 5))

	for id := ID(1); id <= 5; id++ {
		got, err := s.Get(ctx, "job-a", id)
		if id <= 2 {
			if !errors.Is(err, ErrNotFound) {
				t.Errorf("Get(%d) after retention: err = %v, want ErrNotFound", id, err)
			}
			// Its records are gone from pebble, not just hidden.
			for _, kind := range []byte{recMeta, recHandles} {
				if _, closer, err := s.db.Get(cpKey("job-a", id, kind)); !errors.Is(err, pebble.ErrNotFound) {
					if err == nil {
						closer.Close()
					}
					t.Errorf("record %c of dropped checkpoint %d still in pebble (err %v)", kind, id, err)
				}
			}
			continue
		}
		if err != nil {
			t.Fatalf("Get(%d): %v", id, err)
		}
		assertCheckpoint(t, got, testCheckpoint("job-a", id))
	}

	sums, err := s.List(ctx, "job-a")
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if ids := listIDs(sums); !slices.Equal(ids, []ID{5, 4, 3}) {
		t.Fatalf("List ids = %v, want [5 4 3]", ids)
	}
	for _, sum := range sums {
		want := testCheckpoint("job-a", sum.ID)
		if sum.Err != nil || !sum.TriggeredAt.Equal(want.TriggeredAt) || !sum.CompletedAt.Equal(want.CompletedAt) ||
			sum.Duration != want.CompletedAt.Sub(want.TriggeredAt) || sum.Size != want.Size() || !reflect.DeepEqual(sum.Stats, want.Stats) {
			t.Errorf("summary %+v does not match checkpoint %+v", sum, want)
		}
	}

	other, err := s.Latest(ctx, "job-a/b")
	if err != nil {
		t.Fatalf("Latest(job-a/b): %v", err)
	}
	assertCheckpoint(t, other, testCheckpoint("job-a/b", 1))
	if _, err := s.Latest(ctx, "job"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Latest of a job never saved: err = %v, want ErrNotFound", err)
	}
}

func TestStoreRoundTripsEmptyAndMinimalCheckpoints(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, "db", WithFS(vfs.NewMem()))
	defer mustClose(t, s)
	cases := []Completed{
		{Job: "j", ID: 1},
		{Job: "j", ID: 2, Tasks: map[TaskID]TaskSnapshot{"t": {Task: "t"}}},
		{Job: "j", ID: 3, TriggeredAt: time.Unix(5, 6).In(time.FixedZone("x", 3600)), Tasks: map[TaskID]TaskSnapshot{
			"t": {Task: "t", Operators: []OperatorSnapshot{{UID: "u", Subtask: -1, KeyGroups: map[int][]byte{-3: {1}}}}},
		}},
	}
	for _, c := range cases {
		if err := s.Save(ctx, c); err != nil {
			t.Fatalf("Save(%d): %v", c.ID, err)
		}
		got, err := s.Get(ctx, c.Job, c.ID)
		if err != nil {
			t.Fatalf("Get(%d): %v", c.ID, err)
		}
		if !got.TriggeredAt.Equal(c.TriggeredAt) || got.TriggeredAt.Format(time.RFC3339Nano) != c.TriggeredAt.Format(time.RFC3339Nano) {
			t.Errorf("checkpoint %d: TriggeredAt %v, want %v", c.ID, got.TriggeredAt, c.TriggeredAt)
		}
		got.TriggeredAt = c.TriggeredAt
		assertCheckpoint(t, got, c)
	}
}

func TestSaveRefusesInvalidCheckpoints(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, "db", WithFS(vfs.NewMem()))
	defer mustClose(t, s)
	if err := s.Save(ctx, testCheckpoint("j", 5)); err != nil {
		t.Fatal(err)
	}
	mismatched := testCheckpoint("j", 9)
	mismatched.Tasks["map#0"] = TaskSnapshot{Task: "other"}
	cases := []struct {
		name string
		c    Completed
		is   error
	}{
		{"same id", testCheckpoint("j", 5), ErrIDNotIncreasing},
		{"lower id", testCheckpoint("j", 4), ErrIDNotIncreasing},
		{"id zero", testCheckpoint("j", 0), nil},
		{"empty job", testCheckpoint("", 7), nil},
		{"job with NUL", testCheckpoint("a\x00b", 7), nil},
		{"task key differs from snapshot", mismatched, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := s.Save(ctx, tc.c)
			if err == nil {
				t.Fatal("Save succeeded")
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("err = %v, want it to wrap %v", err, tc.is)
			}
		})
	}
	got, err := s.Latest(ctx, "j")
	if err != nil {
		t.Fatal(err)
	}
	assertCheckpoint(t, got, testCheckpoint("j", 5))
}

func TestNextIDStrictlyIncreasesAcrossReopen(t *testing.T) {
	ctx := context.Background()
	for _, block := range []int{1, 4} {
		t.Run(fmt.Sprintf("block=%d", block), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "store")
			var last ID
			next := func(s *Store) ID {
				t.Helper()
				id, err := s.NextID(ctx, "j")
				if err != nil {
					t.Fatalf("NextID: %v", err)
				}
				if id <= last {
					t.Fatalf("NextID = %d after %d", id, last)
				}
				last = id
				return id
			}
			s := mustOpen(t, dir, WithIDBlock(block))
			for range 6 {
				next(s)
			}
			// Ids handed out but never completed are not reused after a restart.
			mustClose(t, s)
			s = mustOpen(t, dir, WithIDBlock(block))
			next(s)
			// A checkpoint saved with an id from elsewhere raises the floor.
			if err := s.Save(ctx, testCheckpoint("j", last+100)); err != nil {
				t.Fatal(err)
			}
			last += 100
			next(s)
			mustClose(t, s)
			s = mustOpen(t, dir, WithIDBlock(block))
			next(s)
			// Deleting the job keeps its high-water mark.
			if err := s.DeleteJob(ctx, "j"); err != nil {
				t.Fatal(err)
			}
			mustClose(t, s)
			s = mustOpen(t, dir, WithIDBlock(block))
			defer mustClose(t, s)
			next(s)
			if id, err := s.NextID(ctx, "other"); err != nil || id != 1 {
				t.Fatalf("NextID of a new job = %d, %v; want 1", id, err)
			}
		})
	}
}

func TestDeleteJobRemovesOnlyThatJob(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, "db", WithFS(vfs.NewMem()))
	defer mustClose(t, s)
	for _, job := range []string{"a", "a/b", "ab"} {
		for id := ID(1); id <= 2; id++ {
			if err := s.Save(ctx, testCheckpoint(job, id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.DeleteJob(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Latest(ctx, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Latest after DeleteJob: %v, want ErrNotFound", err)
	}
	if sums, err := s.List(ctx, "a"); err != nil || len(sums) != 0 {
		t.Fatalf("List after DeleteJob = %v, %v; want empty", sums, err)
	}
	for _, job := range []string{"a/b", "ab"} {
		got, err := s.Latest(ctx, job)
		if err != nil {
			t.Fatalf("Latest(%q): %v", job, err)
		}
		assertCheckpoint(t, got, testCheckpoint(job, 2))
	}
	// The job can start again, above its old ids.
	if err := s.Save(ctx, testCheckpoint("a", 1)); err != nil {
		t.Fatalf("Save after DeleteJob: %v", err)
	}
	if id, err := s.NextID(ctx, "a"); err != nil || id <= 2 {
		t.Fatalf("NextID after DeleteJob = %d, %v; want > 2", id, err)
	}
}

// corruptions damage a stored record value.
var corruptions = []struct {
	name string
	fn   func(v []byte) []byte
}{
	{"payload byte flipped", func(v []byte) []byte { v[len(v)/2+headerSize/2] ^= 0x10; return v }},
	{"checksum byte flipped", func(v []byte) []byte { v[2] ^= 0x01; return v }},
	{"format byte changed", func(v []byte) []byte { v[0] = 9; return v }},
	{"truncated", func(v []byte) []byte { return v[:len(v)-3] }},
	{"too short", func(v []byte) []byte { return v[:2] }},
}

func corruptRecord(t *testing.T, s *Store, job string, id ID, kind byte, fn func([]byte) []byte) {
	t.Helper()
	k := cpKey(job, id, kind)
	v, err := s.get(k)
	if err != nil || v == nil {
		t.Fatalf("reading record %c of %d: %v", kind, id, err)
	}
	if err := s.db.Set(k, fn(v), pebble.Sync); err != nil {
		t.Fatal(err)
	}
}

func TestLatestRefusesCorruptNewestAndLatestUsableFallsBack(t *testing.T) {
	ctx := context.Background()
	for _, cor := range corruptions {
		t.Run(cor.name, func(t *testing.T) {
			s := mustOpen(t, "db", WithFS(vfs.NewMem()))
			defer mustClose(t, s)
			for id := ID(1); id <= 3; id++ {
				if err := s.Save(ctx, testCheckpoint("j", id)); err != nil {
					t.Fatal(err)
				}
			}
			corruptRecord(t, s, "j", 3, recMeta, cor.fn)

			_, err := s.Latest(ctx, "j")
			var ce *CorruptError
			if !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce) {
				t.Fatalf("Latest: err = %v, want a *CorruptError wrapping ErrCorrupt", err)
			}
			if ce.ID != 3 || ce.Job != "j" || ce.Record != "meta" || !strings.Contains(err.Error(), "checkpoint 3") {
				t.Fatalf("Latest: error %q does not name job j checkpoint 3 meta", err)
			}
			if _, err := s.Get(ctx, "j", 3); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Get(3): err = %v, want ErrCorrupt", err)
			}

			got, skipped, err := s.LatestUsable(ctx, "j")
			if err != nil {
				t.Fatalf("LatestUsable: %v", err)
			}
			assertCheckpoint(t, got, testCheckpoint("j", 2))
			if len(skipped) != 1 || skipped[0].ID != 3 || !errors.Is(skipped[0].Err, ErrCorrupt) || !skipped[0].HandlesOK {
				t.Fatalf("skipped = %+v, want checkpoint 3 with intact handles", skipped)
			}
			if want := testCheckpoint("j", 3).Handles(); !sameHandles(skipped[0].Handles, want) {
				t.Fatalf("skipped handles = %v, want %v", skipped[0].Handles, want)
			}
			// Each skipped handle names the operator that pre-committed it.
			owners := map[string][]TxnHandle{}
			for _, o := range skipped[0].Owners {
				owners[string(o.Task)+"/"+o.UID] = append(owners[string(o.Task)+"/"+o.UID], o.Handles...)
			}
			for task, ts := range testCheckpoint("j", 3).Tasks {
				for _, op := range ts.Operators {
					if got := owners[string(task)+"/"+op.UID]; !sameHandles(got, op.Handles) {
						t.Fatalf("skipped owner %s/%s: handles %v, want %v", task, op.UID, got, op.Handles)
					}
				}
			}

			sums, err := s.List(ctx, "j")
			if err != nil {
				t.Fatal(err)
			}
			if ids := listIDs(sums); !slices.Equal(ids, []ID{3, 2, 1}) || !errors.Is(sums[0].Err, ErrCorrupt) || sums[1].Err != nil {
				t.Fatalf("List = %+v, want 3 (corrupt), 2, 1", sums)
			}
		})
	}
}

func sameHandles(a, b []TxnHandle) bool {
	key := func(h TxnHandle) string { return fmt.Sprint(h) }
	as, bs := make([]string, len(a)), make([]string, len(b))
	for i := range a {
		as[i] = key(a[i])
	}
	for i := range b {
		bs[i] = key(b[i])
	}
	slices.Sort(as)
	slices.Sort(bs)
	return slices.Equal(as, bs)
}

func TestLatestUsableReportsSkippedCheckpointsNewestFirst(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, "db", WithFS(vfs.NewMem()))
	defer mustClose(t, s)
	for id := ID(1); id <= 3; id++ {
		if err := s.Save(ctx, testCheckpoint("j", id)); err != nil {
			t.Fatal(err)
		}
	}
	flip := corruptions[0].fn
	corruptRecord(t, s, "j", 3, recHandles, flip) // handles lost: cannot be reported
	corruptRecord(t, s, "j", 2, recMeta, flip)    // state lost, handles intact

	if _, err := s.Latest(ctx, "j"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Latest with corrupt handles: err = %v, want ErrCorrupt", err)
	}
	got, skipped, err := s.LatestUsable(ctx, "j")
	if err != nil {
		t.Fatal(err)
	}
	assertCheckpoint(t, got, testCheckpoint("j", 1))
	if len(skipped) != 2 || skipped[0].ID != 3 || skipped[0].HandlesOK || skipped[0].Handles != nil ||
		skipped[1].ID != 2 || !skipped[1].HandlesOK || !sameHandles(skipped[1].Handles, testCheckpoint("j", 2).Handles()) {
		t.Fatalf("skipped = %+v", skipped)
	}

	corruptRecord(t, s, "j", 1, recMeta, flip)
	_, skipped, err = s.LatestUsable(ctx, "j")
	if !errors.Is(err, ErrNotFound) || !errors.Is(err, ErrCorrupt) || len(skipped) != 3 {
		t.Fatalf("LatestUsable with every checkpoint corrupt: err = %v, %d skipped; want ErrNotFound and ErrCorrupt, 3 skipped", err, len(skipped))
	}
	// Saving a new checkpoint is still possible and becomes the latest.
	if err := s.Save(ctx, testCheckpoint("j", 4)); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Latest(ctx, "j"); err != nil || got.ID != 4 {
		t.Fatalf("Latest after new save = %d, %v", got.ID, err)
	}
}

func TestRecordMovedToAnotherKeyFailsVerification(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, "db", WithFS(vfs.NewMem()))
	defer mustClose(t, s)
	for id := ID(1); id <= 2; id++ {
		if err := s.Save(ctx, testCheckpoint("j", id)); err != nil {
			t.Fatal(err)
		}
	}
	old, err := s.get(cpKey("j", 1, recMeta))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.db.Set(cpKey("j", 2, recMeta), old, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Latest(ctx, "j"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Latest with checkpoint 1's record under checkpoint 2's key: err = %v, want ErrCorrupt", err)
	}
}

func TestClosedStoreRefusesCalls(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, "db", WithFS(vfs.NewMem()))
	mustClose(t, s)
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	calls := map[string]func() error{
		"Save":   func() error { return s.Save(ctx, testCheckpoint("j", 1)) },
		"Latest": func() error { _, err := s.Latest(ctx, "j"); return err },
		"LatestUsable": func() error {
			_, _, err := s.LatestUsable(ctx, "j")
			return err
		},
		"Get":       func() error { _, err := s.Get(ctx, "j", 1); return err },
		"List":      func() error { _, err := s.List(ctx, "j"); return err },
		"NextID":    func() error { _, err := s.NextID(ctx, "j"); return err },
		"DeleteJob": func() error { return s.DeleteJob(ctx, "j") },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, ErrStoreClosed) {
			t.Errorf("%s on a closed store: err = %v, want ErrStoreClosed", name, err)
		}
	}
}

func TestCanceledContextStopsCalls(t *testing.T) {
	s := mustOpen(t, "db", WithFS(vfs.NewMem()))
	defer mustClose(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Save(ctx, testCheckpoint("j", 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Save: err = %v, want context.Canceled", err)
	}
	if _, err := s.NextID(ctx, "j"); !errors.Is(err, context.Canceled) {
		t.Fatalf("NextID: err = %v, want context.Canceled", err)
	}
	if _, err := s.Latest(context.Background(), "j"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("nothing must have been saved: %v", err)
	}
}

func TestOpenStoreRejectsForeignAndDamagedDirectories(t *testing.T) {
	writeFile := func(t *testing.T, path string, data []byte) {
		t.Helper()
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// storeDir makes a real store with a few checkpoints and returns its dir.
	storeDir := func(t *testing.T) string {
		dir := t.TempDir()
		s := mustOpen(t, dir)
		for id := ID(1); id <= 3; id++ {
			if err := s.Save(context.Background(), testCheckpoint("j", id)); err != nil {
				t.Fatal(err)
			}
		}
		mustClose(t, s)
		return dir
	}
	glob := func(t *testing.T, dir, pattern string) []string {
		m, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil || len(m) == 0 {
			t.Fatalf("no %s in %s (%v)", pattern, dir, err)
		}
		return m
	}
	cases := []struct {
		name  string
		setup func(t *testing.T) string
		is    error
	}{
		{"directory of other files", func(t *testing.T) string {
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "notes.txt"), []byte("hello"))
			return dir
		}, ErrNotAStore},
		{"path is a regular file", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "file")
			writeFile(t, p, []byte("x"))
			return p
		}, nil},
		{"pebble database of something else", func(t *testing.T) string {
			dir := t.TempDir()
			db, err := pebble.Open(dir, &pebble.Options{Logger: pebbleLogger{zap.NewNop()}})
			if err != nil {
				t.Fatal(err)
			}
			if err := errors.Join(db.Set([]byte("jobs/1"), []byte("x"), pebble.Sync), db.Close()); err != nil {
				t.Fatal(err)
			}
			return dir
		}, ErrNotAStore},
		{"manifest truncated", func(t *testing.T) string {
			dir := storeDir(t)
			for _, m := range glob(t, dir, "MANIFEST-*") {
				writeFile(t, m, []byte{1, 2})
			}
			return dir
		}, nil},
		{"manifest garbage", func(t *testing.T) string {
			dir := storeDir(t)
			for _, m := range glob(t, dir, "MANIFEST-*") {
				writeFile(t, m, []byte(strings.Repeat("garbage!", 512)))
			}
			return dir
		}, nil},
		{"manifest missing", func(t *testing.T) string {
			dir := storeDir(t)
			for _, m := range glob(t, dir, "MANIFEST-*") {
				if err := os.Remove(m); err != nil {
					t.Fatal(err)
				}
			}
			return dir
		}, nil},
		{"options garbage", func(t *testing.T) string {
			dir := storeDir(t)
			for _, m := range glob(t, dir, "OPTIONS-*") {
				writeFile(t, m, []byte("[Version]\n\x00\x01garbage"))
			}
			return dir
		}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.setup(t)
			s, err := OpenStore(dir)
			if err == nil {
				mustClose(t, s)
				t.Fatalf("OpenStore(%s) succeeded", tc.name)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("err = %v, want it to wrap %v", err, tc.is)
			}
			if !strings.Contains(err.Error(), dir) {
				t.Fatalf("error %q does not name the directory", err)
			}
			t.Logf("%s: %v", tc.name, err)
		})
	}
}

func TestOpenStoreCreatesMissingDirectoryAndReopensEmptyStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	for range 2 {
		s := mustOpen(t, dir)
		if _, err := s.Latest(context.Background(), "j"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Latest on a new store: %v", err)
		}
		mustClose(t, s)
	}
	if _, err := OpenStore(dir, WithRetained(0)); err == nil {
		t.Fatal("WithRetained(0) accepted")
	}
}

// TestStoreCrashSafety saves checkpoints while taking crash clones of the
// filesystem (between saves and while a save is in flight) and checks what a
// restart on each clone finds.
func TestStoreCrashSafety(t *testing.T) {
	const (
		seeds = 50
		steps = 6
		job   = "crashy"
	)
	ctx := context.Background()
	clones, inFlight, inFlightKept := 0, 0, 0
	for seed := uint64(1); seed <= seeds; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		retained := 1 + rng.IntN(3)
		block := 1 + rng.IntN(3)
		fs := vfs.NewCrashableMem()
		// Slow syncs (exponential, mean 200us) widen the window in which a
		// save is written but not yet durable, where the clones below land.
		slow := errorfs.Wrap(fs, errorfs.RandomLatency(syncOps{}, 200*time.Microsecond, int64(seed), 50*time.Millisecond))
		s := mustOpen(t, "db", WithFS(slow), WithRetained(retained), WithIDBlock(block))

		var (
			started  atomic.Uint64 // id of the latest Save begun
			done     atomic.Uint64 // id of the latest Save that returned nil
			returned atomic.Uint64 // highest id NextID returned
			mu       sync.Mutex
			ids      []ID // every id a Save was begun for, in order
		)
		tokens := make(chan struct{})
		stepDone := make(chan error)
		go func() {
			for range tokens {
				id, err := s.NextID(ctx, job)
				if err != nil {
					stepDone <- err
					continue
				}
				returned.Store(uint64(id))
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
				started.Store(uint64(id))
				err = s.Save(ctx, testCheckpoint(job, id))
				if err == nil {
					done.Store(uint64(id))
				}
				stepDone <- err
			}
		}()

		check := func(where string) {
			lo, maxReturned := ID(done.Load()), ID(returned.Load())
			pct := rng.IntN(101)
			clone := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rng})
			hi := ID(started.Load())
			mu.Lock()
			begun := slices.Clone(ids)
			mu.Unlock()
			clones++
			latest := verifyCrashClone(t, fmt.Sprintf("seed %d %s (unsynced %d%%)", seed, where, pct), clone, job, retained, lo, hi, maxReturned, begun)
			if hi > lo {
				inFlight++
				if latest == hi {
					inFlightKept++
				}
			}
		}

		for step := range steps {
			between := rng.IntN(2) == 0
			if between {
				check(fmt.Sprintf("before step %d", step))
			}
			tokens <- struct{}{}
			if !between {
				for range rng.IntN(200) {
					runtime.Gosched()
				}
				time.Sleep(time.Duration(rng.IntN(400)) * time.Microsecond)
				check(fmt.Sprintf("during step %d", step))
			}
			if err := <-stepDone; err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
		}
		close(tokens)
		check("after last step")
		mustClose(t, s)
	}
	t.Logf("%d seeds, %d crash clones verified; %d taken with a save in flight, of which %d kept it", seeds, clones, inFlight, inFlightKept)
}

// verifyCrashClone opens a crash clone and checks that what it holds is one
// fully saved checkpoint between lo (last Save that returned) and hi (last
// Save begun), that retention left exactly the right whole checkpoints, and
// that NextID does not repeat.
func verifyCrashClone(t *testing.T, what string, fs vfs.FS, job string, retained int, lo, hi, maxReturned ID, begun []ID) (latest ID) {
	t.Helper()
	ctx := context.Background()
	s, err := OpenStore("db", WithFS(fs), WithRetained(retained))
	if err != nil {
		t.Fatalf("%s: reopen: %v", what, err)
	}
	defer mustClose(t, s)

	c, err := s.Latest(ctx, job)
	switch {
	case errors.Is(err, ErrNotFound) && lo == 0:
	case err != nil:
		t.Fatalf("%s: Latest: %v (saved up to %d, in flight %d)", what, err, lo, hi)
	case c.ID < lo || c.ID > hi || !slices.Contains(begun, c.ID):
		t.Fatalf("%s: Latest is %d, want a saved one in [%d, %d] of %v", what, c.ID, lo, hi, begun)
	default:
		assertCheckpoint(t, c, testCheckpoint(job, c.ID))
	}

	// Retention: exactly the last `retained` begun ids up to the latest,
	// each whole.
	var want []ID
	for i := len(begun) - 1; i >= 0 && len(want) < retained; i-- {
		if err == nil && begun[i] <= c.ID {
			want = append(want, begun[i])
		}
	}
	sums, lerr := s.List(ctx, job)
	if lerr != nil {
		t.Fatalf("%s: List: %v", what, lerr)
	}
	if got := listIDs(sums); !slices.Equal(got, want) {
		t.Fatalf("%s: List = %v, want %v", what, got, want)
	}
	for _, sum := range sums {
		if sum.Err != nil {
			t.Fatalf("%s: checkpoint %d torn: %v", what, sum.ID, sum.Err)
		}
		got, err := s.Get(ctx, job, sum.ID)
		if err != nil {
			t.Fatalf("%s: Get(%d): %v", what, sum.ID, err)
		}
		assertCheckpoint(t, got, testCheckpoint(job, sum.ID))
	}

	id, err := s.NextID(ctx, job)
	if err != nil {
		t.Fatalf("%s: NextID: %v", what, err)
	}
	if id <= maxReturned {
		t.Fatalf("%s: NextID = %d, but %d was returned before the crash", what, id, maxReturned)
	}
	// The recovered store takes new checkpoints.
	if err := s.Save(ctx, testCheckpoint(job, id)); err != nil {
		t.Fatalf("%s: Save after recovery: %v", what, err)
	}
	return c.ID
}

// TestStoreOperationsFailCleanlyUnderInjectedIOErrors injects one write or
// sync error at every write-side filesystem operation of a run of
// NextID+Save calls in turn. The failing call must return an error, and a
// restart on the synced state must find either the previous latest or the
// new checkpoint, intact.
func TestStoreOperationsFailCleanlyUnderInjectedIOErrors(t *testing.T) {
	ctx := context.Background()
	const job = "errs"
	injected := 0
	for i := int32(0); ; i++ {
		if i > 1000 {
			t.Fatal("injection index never ran past the workload")
		}
		base := vfs.NewCrashableMem()
		var (
			armed atomic.Bool
			count atomic.Int32
			hitOp atomic.Pointer[errorfs.Op]
		)
		inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
			if !armed.Load() || op.Kind.ReadOrWrite() != errorfs.OpIsWrite {
				return nil
			}
			if count.Add(1)-1 == i {
				hitOp.Store(&op)
				return errorfs.ErrInjected
			}
			return nil
		})
		s := mustOpen(t, "db", WithFS(errorfs.Wrap(base, inj)), WithRetained(2))
		var lastOK, maxReturned ID
		for range 2 {
			id, err := s.NextID(ctx, job)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Save(ctx, testCheckpoint(job, id)); err != nil {
				t.Fatal(err)
			}
			lastOK, maxReturned = id, id
		}

		armed.Store(true)
		var (
			failedSave ID
			opErr      error
		)
		for range 3 {
			id, err := s.NextID(ctx, job)
			if err != nil {
				opErr = err
				break
			}
			maxReturned = id
			if err := s.Save(ctx, testCheckpoint(job, id)); err != nil {
				failedSave, opErr = id, err
				break
			}
			lastOK = id
		}
		armed.Store(false)

		op := hitOp.Load()
		if op == nil {
			if opErr != nil {
				t.Fatalf("index %d: no error injected, but: %v", i, opErr)
			}
			mustClose(t, s)
			if injected == 0 {
				t.Fatal("no injection point found")
			}
			t.Logf("%d injection points, each failing cleanly", injected)
			return
		}
		injected++
		if opErr == nil {
			t.Fatalf("index %d: error injected at %s %s, but every call succeeded", i, opName(op.Kind), op.Path)
		}
		if !errors.Is(opErr, errorfs.ErrInjected) {
			t.Fatalf("index %d: error %v does not wrap the injected error", i, opErr)
		}
		if errors.Is(opErr, ErrStoreFailed) {
			if !errors.Is(opErr, ErrOutcomeUnknown) {
				t.Fatalf("index %d: store failure %v does not say the outcome is unknown", i, opErr)
			}
			if _, err := s.Latest(ctx, job); !errors.Is(err, ErrStoreFailed) {
				t.Fatalf("index %d: Latest on a failed store: err = %v, want ErrStoreFailed", i, err)
			}
		}
		t.Logf("index %d: %s on %s -> %v", i, opName(op.Kind), filepath.Base(op.Path), opErr)

		clone := base.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
		if err := s.Close(); err != nil {
			t.Logf("index %d: Close after failure: %v", i, err)
		}

		s2 := mustOpen(t, "db", WithFS(clone), WithRetained(2))
		c, err := s2.Latest(ctx, job)
		if err != nil {
			t.Fatalf("index %d: Latest after restart: %v", i, err)
		}
		if c.ID != lastOK && (failedSave == 0 || c.ID != failedSave) {
			t.Fatalf("index %d: Latest after restart is %d, want %d or the failed %d", i, c.ID, lastOK, failedSave)
		}
		assertCheckpoint(t, c, testCheckpoint(job, c.ID))
		id, err := s2.NextID(ctx, job)
		if err != nil || id <= maxReturned {
			t.Fatalf("index %d: NextID after restart = %d, %v; returned before: %d", i, id, err, maxReturned)
		}
		mustClose(t, s2)
	}
}

func opName(k errorfs.OpKind) string {
	switch k {
	case errorfs.OpFileWrite, errorfs.OpFileWriteAt:
		return "write"
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
		return "sync"
	case errorfs.OpFileFlush:
		return "flush"
	case errorfs.OpFilePreallocate:
		return "preallocate"
	default:
		return fmt.Sprintf("op %d", k)
	}
}

// syncOps selects the sync operations of a filesystem.
type syncOps struct{}

func (syncOps) String() string { return "syncs" }

func (syncOps) Evaluate(op errorfs.Op) bool {
	switch op.Kind {
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
		return true
	}
	return false
}

// Reopen makes a failed store usable again; what it then holds is what the
// failed write left durable (here: the last good checkpoint or the one in
// doubt). A healthy store is left alone; a closed one refuses.
func TestReopenRecoversAFailedStore(t *testing.T) {
	ctx := t.Context()
	var armed atomic.Bool
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && (syncOps{}).Evaluate(op) {
			return errorfs.ErrInjected
		}
		return nil
	})
	s := mustOpen(t, "db", WithFS(errorfs.Wrap(vfs.NewMem(), inj)))
	if err := s.Reopen(); err != nil {
		t.Fatalf("Reopen of a healthy store: %v", err)
	}
	if err := s.Save(ctx, testCheckpoint("j", 1)); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	if err := s.Save(ctx, testCheckpoint("j", 2)); !errors.Is(err, ErrStoreFailed) {
		t.Fatalf("Save with failing syncs: %v, want ErrStoreFailed", err)
	}
	armed.Store(false)
	if _, err := s.Latest(ctx, "j"); !errors.Is(err, ErrStoreFailed) {
		t.Fatalf("Latest on the failed store: %v", err)
	}
	if err := s.Reopen(); err != nil {
		t.Fatalf("Reopen: %v", err)
	}
	c, err := s.Latest(ctx, "j")
	if err != nil || (c.ID != 1 && c.ID != 2) {
		t.Fatalf("Latest after Reopen = %d, %v; want 1 or 2", c.ID, err)
	}
	assertCheckpoint(t, c, testCheckpoint("j", c.ID))
	id, err := s.NextID(ctx, "j")
	if err != nil || id <= c.ID {
		t.Fatalf("NextID after Reopen = %d, %v; want above %d", id, err, c.ID)
	}
	mustClose(t, s)
	if err := s.Reopen(); !errors.Is(err, ErrStoreClosed) {
		t.Fatalf("Reopen of a closed store: %v, want ErrStoreClosed", err)
	}
}

// Save keeps the ids of a job's checkpoints in memory (it used to list them
// from pebble every time): retention, the increasing-id check and DeleteJob
// behave as they do on a freshly opened store, and a reopened store agrees.
func TestSaveKeepsRetentionAndIDOrderAcrossDeletesAndReopens(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "store")
	s := mustOpen(t, dir, WithRetained(3))
	list := func(s *Store) []ID {
		t.Helper()
		sums, err := s.List(ctx, "j")
		if err != nil {
			t.Fatal(err)
		}
		return listIDs(sums)
	}
	for id := ID(1); id <= 10; id++ {
		if err := s.Save(ctx, testCheckpoint("j", id)); err != nil {
			t.Fatalf("Save(%d): %v", id, err)
		}
	}
	if got := list(s); !slices.Equal(got, []ID{10, 9, 8}) { // newest first
		t.Fatalf("after 10 saves: %v, want [10 9 8]", got)
	}
	if err := s.Save(ctx, testCheckpoint("j", 10)); !errors.Is(err, ErrIDNotIncreasing) {
		t.Fatalf("Save(10) again: %v, want ErrIDNotIncreasing", err)
	}
	if err := s.DeleteJob(ctx, "j"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []ID{11, 12} {
		if err := s.Save(ctx, testCheckpoint("j", id)); err != nil {
			t.Fatalf("Save(%d) after DeleteJob: %v", id, err)
		}
	}
	if got := list(s); !slices.Equal(got, []ID{12, 11}) {
		t.Fatalf("after DeleteJob and two saves: %v, want [12 11]", got)
	}
	mustClose(t, s)
	s = mustOpen(t, dir, WithRetained(2))
	defer mustClose(t, s)
	if err := s.Save(ctx, testCheckpoint("j", 13)); err != nil {
		t.Fatal(err)
	}
	if got := list(s); !slices.Equal(got, []ID{13, 12}) {
		t.Fatalf("reopened with 2 retained: %v, want [13 12]", got)
	}
}

// An in-memory store (the mini cluster's without a checkpoint directory)
// saves, retains and finds checkpoints as a store on disk does, and writes
// nothing to disk.
func TestInMemoryStoreKeepsCheckpointsWithoutTouchingTheDisk(t *testing.T) {
	ctx := t.Context()
	t.Chdir(t.TempDir())
	s := mustOpen(t, "db", InMemory())
	defer mustClose(t, s)
	for id := ID(1); id <= 5; id++ {
		c := Completed{Job: "j", ID: id, Tasks: map[TaskID]TaskSnapshot{"t": {Task: "t"}}}
		if err := s.Save(ctx, c); err != nil {
			t.Fatalf("Save(%d): %v", id, err)
		}
	}
	latest, skipped, err := s.LatestUsable(ctx, "j")
	if err != nil || latest.ID != 5 || len(skipped) != 0 {
		t.Fatalf("LatestUsable: checkpoint %d, skipped %v, %v; want 5", latest.ID, skipped, err)
	}
	if _, err := s.Get(ctx, "j", 2); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get(2): %v, want ErrNotFound (3 are retained)", err)
	}
	if ents, err := os.ReadDir("."); err != nil || len(ents) != 0 {
		t.Fatalf("an in-memory store wrote %v to the working directory (%v)", ents, err)
	}
}

// An in-memory store keeps no write-ahead log: nothing could replay it, and
// copying every saved checkpoint into it was about 8% of the CPU a busy
// job's checkpoints cost. Checkpoints saved past a memtable's worth (so
// pebble flushed some) are all found.
func TestInMemoryStoreWritesNoLogAndKeepsWhatItSaved(t *testing.T) {
	ctx := t.Context()
	s := mustOpen(t, "db", InMemory(), WithRetained(2))
	defer mustClose(t, s)
	state := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	cp := func(id ID) Completed {
		return Completed{Job: "j", ID: id, Tasks: map[TaskID]TaskSnapshot{"t": {Task: "t", Operators: []OperatorSnapshot{
			{UID: "op", KeyGroups: map[int][]byte{int(id) % 128: append(binary.AppendUvarint(nil, uint64(id)), state...)}}}}}}
	}
	for id := ID(1); id <= 12; id++ {
		if err := s.Save(ctx, cp(id)); err != nil {
			t.Fatalf("Save(%d): %v", id, err)
		}
	}
	names, err := s.cfg.fs.List("db")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if !strings.HasSuffix(n, ".log") {
			continue
		}
		if st, err := s.cfg.fs.Stat(s.cfg.fs.PathJoin("db", n)); err != nil || st.Size() > 0 {
			t.Fatalf("write-ahead log %s holds %d bytes (%v) after 12 MiB of checkpoints, want none", n, st.Size(), err)
		}
	}
	for _, id := range []ID{11, 12} {
		got, err := s.Get(ctx, "j", id)
		if err != nil {
			t.Fatalf("Get(%d): %v", id, err)
		}
		assertCheckpoint(t, got, cp(id))
	}
}
