package runtime

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRegistryBuildsFromNameAndParams(t *testing.T) {
	r := NewRegistry()
	var got Params
	err := r.Register(JobType{Name: "seq", Params: []ParamSpec{{Name: "n", Default: "5"}, {Name: "mode", Default: "a"}},
		Build: func(p Params) (*Job, error) {
			got = p
			if _, err := p.Int("n"); err != nil {
				return nil, err
			}
			if _, err := p.OneOf("mode", "a", "b"); err != nil {
				return nil, err
			}
			if _, err := p.JobOpts(); err != nil {
				return nil, err
			}
			return NewJob("seq"), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(JobType{Name: "seq", Build: func(Params) (*Job, error) { return nil, nil }}); err == nil {
		t.Fatal("duplicate registration accepted")
	}
	if _, err := r.Build("seq", map[string]string{"n": "7"}); err != nil {
		t.Fatal(err)
	}
	if got["n"] != "7" || got["mode"] != "a" {
		t.Fatalf("params %v: want n=7 and the default mode=a", got)
	}
	cases := []struct {
		name   string
		job    string
		params map[string]string
		want   error
	}{
		{"unknown job", "nope", nil, ErrUnknownJob},
		{"unknown param", "seq", map[string]string{"typo": "1"}, ErrBadParam},
		{"bad int", "seq", map[string]string{"n": "x"}, ErrBadParam},
		{"bad choice", "seq", map[string]string{"mode": "c"}, ErrBadParam},
		{"bad parallelism", "seq", map[string]string{"parallelism": "0"}, ErrBadParam},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := r.Build(tc.job, tc.params); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// Params.Durations parses every named parameter, in order, and refuses a
// malformed or negative one by name (ErrBadParam): the event-time
// parameters of both Kafka sources' ParamWatermarks go through it.
func TestParamsDurationsParseInOrderAndRefuseMalformedOrNegativeValues(t *testing.T) {
	for _, tc := range []struct {
		name    string
		params  Params
		want    []time.Duration
		wantErr string
	}{
		{"every value", Params{"a": "5s", "b": "0s", "c": "1m"}, []time.Duration{5 * time.Second, 0, time.Minute}, ""},
		{"negative", Params{"a": "5s", "b": "-1s", "c": "1m"}, nil, "b=-1s < 0"},
		{"malformed", Params{"a": "5s", "b": "1s", "c": "soon"}, nil, `c="soon" is not a duration`},
		{"missing", Params{"a": "5s", "b": "1s"}, nil, `c="" is not a duration`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.params.Durations("a", "b", "c")
			if tc.wantErr != "" {
				if !errors.Is(err, ErrBadParam) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Durations: %v, %v; want ErrBadParam saying %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("Durations: %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
