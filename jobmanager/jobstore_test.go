package jobmanager_test

import (
	"errors"
	"testing"

	"github.com/weirstream/weir/jobmanager"
)

// Job records survive closing and reopening the store on the same
// directory (a job manager restart); ids are unique.
func TestJobStoreKeepsJobsAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := jobmanager.OpenJobStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for i := 0; i < 3; i++ {
		id, err := jobmanager.NewJobID()
		if err != nil {
			t.Fatal(err)
		}
		if ids[id] {
			t.Fatalf("job id %s handed out twice", id)
		}
		ids[id] = true
		if err := s.Put(jobmanager.JobRecord{ID: id, Type: "wordcount", Params: map[string]string{"input": "lines"},
			State: jobmanager.StateRunning}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = jobmanager.OpenJobStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	jobs, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 3 {
		t.Fatalf("after reopen: %d jobs, want 3", len(jobs))
	}
	for _, j := range jobs {
		if !ids[j.ID] || j.Type != "wordcount" || j.Params["input"] != "lines" || j.State != jobmanager.StateRunning {
			t.Fatalf("after reopen: %+v", j)
		}
		got, err := s.Get(j.ID)
		if err != nil || got.ID != j.ID {
			t.Fatalf("Get(%s) = %+v, %v", j.ID, got, err)
		}
	}
	if _, err := s.Get("nope"); !errors.Is(err, jobmanager.ErrJobNotFound) {
		t.Fatalf("Get of an unknown id: %v, want ErrJobNotFound", err)
	}
}
