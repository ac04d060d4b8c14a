package runtime

import (
	"errors"
	"testing"
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
