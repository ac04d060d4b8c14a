package main

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestJobsListsWordcountWithItsParameters(t *testing.T) {
	out, _, err := runCLI(t, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"wordcount", "--set brokers=", "--set input=", "--set output=", "--set group=", "--set guarantee="} {
		if !strings.Contains(out, want) {
			t.Errorf("jobs output lacks %q:\n%s", want, out)
		}
	}
	out, _, err = runCLI(t, "jobs", "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	var jobs []struct {
		Name   string
		Params []struct{ Name, Default string }
	}
	if err := json.Unmarshal([]byte(out), &jobs); err != nil || len(jobs) != 1 || jobs[0].Name != "wordcount" || len(jobs[0].Params) != 5 {
		t.Fatalf("jobs --output json = %s (%v)", out, err)
	}
	if _, _, err := runCLI(t, "jobs", "--output", "xml"); err == nil {
		t.Fatal("bad --output accepted")
	}
}
