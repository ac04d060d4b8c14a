package checkpoint

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The job type and parameters recorded with WithJob come back from
// ReadSavepointInfo, and a savepoint written without them (as every
// savepoint before the option) reads with them empty.
func TestSavepointRecordsItsJobTypeAndParametersWhenGiven(t *testing.T) {
	now := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	params := map[string]string{"brokers": "b:9092", "parallelism": "2"}
	with, without := filepath.Join(t.TempDir(), "with"), filepath.Join(t.TempDir(), "without")
	if err := WriteSavepoint(t.Context(), with, savepointFixture(), now, WithJob("wordcount", params)); err != nil {
		t.Fatal(err)
	}
	if err := WriteSavepoint(t.Context(), without, savepointFixture(), now); err != nil {
		t.Fatal(err)
	}
	info, err := ReadSavepointInfo(t.Context(), with)
	if err != nil {
		t.Fatal(err)
	}
	fx := savepointFixture()
	if info.Version != SavepointVersion || info.Job != fx.Job || info.Checkpoint != fx.ID || !info.CreatedAt.Equal(now) ||
		info.JobType != "wordcount" || !maps.Equal(info.JobParams, params) {
		t.Fatalf("info %+v", info)
	}
	old, err := ReadSavepointInfo(t.Context(), without)
	if err != nil {
		t.Fatal(err)
	}
	if old.JobType != "" || old.JobParams != nil || old.Checkpoint != fx.ID {
		t.Fatalf("info without WithJob %+v", old)
	}
	raw, err := os.ReadFile(filepath.Join(without, SavepointMetadataFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "job_type") {
		t.Fatalf("a savepoint without WithJob names a job type:\n%s", raw)
	}
	for _, dir := range []string{with, without} {
		if _, err := ReadSavepoint(t.Context(), dir); err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
	}
}

// A read-only store reads what a store saved, lists its jobs, writes
// nothing, and is refused with ErrStoreLocked while another Store has the
// directory open; a directory without a store is not opened read-only.
func TestReadOnlyStoreReadsSavedCheckpointsAndIsRefusedWhileLocked(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	s := mustOpen(t, dir)
	for _, c := range []Completed{testCheckpoint("job-b", 1), testCheckpoint("job-a", 1), testCheckpoint("job-a", 2)} {
		if err := s.Save(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := OpenStore(dir, ReadOnly()); !errors.Is(err, ErrStoreLocked) {
		t.Fatalf("read-only open of a store in use: %v, want ErrStoreLocked", err)
	}
	mustClose(t, s)

	ro := mustOpen(t, dir, ReadOnly())
	defer mustClose(t, ro)
	jobs, err := ro.Jobs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(jobs, []string{"job-a", "job-b"}) {
		t.Fatalf("jobs %v", jobs)
	}
	got, err := ro.Latest(ctx, "job-a")
	if err != nil {
		t.Fatal(err)
	}
	assertCheckpoint(t, got, testCheckpoint("job-a", 2))
	if err := ro.Save(ctx, testCheckpoint("job-a", 3)); err == nil {
		t.Fatal("a read-only store saved a checkpoint")
	}

	empty := t.TempDir()
	if _, err := OpenStore(empty, ReadOnly()); err == nil {
		t.Fatal("an empty directory opened read-only as a store")
	}
	if _, err := OpenStore(filepath.Join(empty, "missing"), ReadOnly()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing directory: %v", err)
	}
	if names, _ := os.ReadDir(empty); len(names) != 0 {
		t.Fatalf("read-only open wrote into %s: %v", empty, names)
	}
}
