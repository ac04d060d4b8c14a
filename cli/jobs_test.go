package cli

import (
	"encoding/json"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// wantWordcountParams are the parameters of the wordcount contract, then the
// reserved parallelism.
var wantWordcountParams = []string{"brokers", "input", "output", "group", "guarantee", "min-length", "source", "start", "stop", "parallelism", "state-backend"}

func TestJobsTableListsEveryParameterWithoutPromisingFlags(t *testing.T) {
	out, _, err := runCLI(t, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "wordcount ") {
		t.Fatalf("jobs output does not start with the wordcount job:\n%s", out)
	}
	for _, p := range wantWordcountParams {
		if !regexp.MustCompile(`(?m)^  ` + p + ` +\S`).MatchString(out) {
			t.Errorf("jobs output lacks a row for %q:\n%s", p, out)
		}
	}
	if !regexp.MustCompile(`(?m)^  parallelism +1 +.*reserved`).MatchString(out) {
		t.Errorf("jobs output does not show parallelism (default 1) as reserved:\n%s", out)
	}
	// No command accepts --set yet: the listing must not suggest one.
	if strings.Contains(out, "--set") {
		t.Errorf("jobs output shows --set, which no command accepts:\n%s", out)
	}
}

func TestJobsJSONHasLowerCaseFieldsAndTheReservedParameters(t *testing.T) {
	out, _, err := runCLI(t, "jobs", "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "(share group or partitions) -> words") {
		t.Errorf("the description is not printed as written (HTML-escaped?):\n%s", out)
	}
	// Decode generically: field names must be exactly these, lower case.
	var jobs []map[string]any
	if err := json.Unmarshal([]byte(out), &jobs); err != nil || len(jobs) != 1 {
		t.Fatalf("jobs --output json = %s (%v), want one job", out, err)
	}
	if got := keysOf(jobs[0]); !reflect.DeepEqual(got, []string{"description", "name", "params"}) {
		t.Fatalf("job fields = %v, want description, name, params", got)
	}
	if jobs[0]["name"] != "wordcount" {
		t.Fatalf("job name = %v", jobs[0]["name"])
	}
	var names []string
	for _, p := range jobs[0]["params"].([]any) {
		pm := p.(map[string]any)
		if got := keysOf(pm); !reflect.DeepEqual(got, []string{"default", "description", "name", "reserved"}) {
			t.Fatalf("param fields = %v, want default, description, name, reserved", got)
		}
		names = append(names, pm["name"].(string))
		if reserved := pm["name"] == "parallelism" || pm["name"] == "state-backend"; pm["reserved"] != reserved {
			t.Errorf("param %v: reserved = %v, want %v", pm["name"], pm["reserved"], reserved)
		}
	}
	if !reflect.DeepEqual(names, wantWordcountParams) {
		t.Fatalf("params = %v, want %v", names, wantWordcountParams)
	}
	if _, _, err := runCLI(t, "jobs", "--output", "xml"); err == nil {
		t.Fatal("bad --output accepted")
	}
}

func keysOf(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
