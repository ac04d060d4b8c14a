package input_test

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/input"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/kafka"
)

// The offsets a job's "start" and "stop" parameters name, as the partition
// source prints them; a value neither can take is refused with
// runtime.ErrBadParam naming the parameter.
func TestOffsetParametersNameThePartitionSourcesOffsets(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        string // Offset.String(), "" for a refusal
	}{
		{"start", "", "earliest"},
		{"start", "earliest", "earliest"},
		{"start", "latest", "latest"},
		{"start", "committed", "committed (fallback earliest)"},
		{"start", "1733349600000", "timestamp 2024-12-04T22:00:00Z"},
		{"start", "2024-12-04T22:00:00Z", "timestamp 2024-12-04T22:00:00Z"},
		{"start", "0=100, 3=7", "offsets"},
		{"stop", "latest", "latest"},
		{"stop", "2024-12-04T22:00:00.5Z", "timestamp 2024-12-04T22:00:00.5Z"},
		{"stop", "1=250", "offsets"},
		{"stop", "earliest", ""},
		{"stop", "committed", ""},
		{"start", "yesterday", ""},
		{"start", "0=1,0=2", ""},
		{"start", "0=-1", ""},
		{"start", "x=1", ""},
	} {
		got, err := input.Offset(runtime.Params{tc.name: tc.value}, tc.name, "lines")
		switch {
		case tc.want == "" && !errors.Is(err, runtime.ErrBadParam):
			t.Errorf("%s=%q: %v, %v; want a refusal wrapping ErrBadParam", tc.name, tc.value, got, err)
		case tc.want != "" && (err != nil || got.String() != tc.want):
			t.Errorf("%s=%q: %v, %v; want %s", tc.name, tc.value, got, err, tc.want)
		}
	}
}

// "source" chooses the source: unset or sharegroup the share group, kafka
// the partition source; anything else is refused.
func TestSourceParameterChoosesTheSource(t *testing.T) {
	decode := func(r *kgo.Record) (string, error) { return string(r.Value), nil }
	c := input.Config{Brokers: []string{"127.0.0.1:9092"}, Topic: "lines", Group: "g"}
	for _, tc := range []struct {
		source    string
		partition bool
		bad       bool
	}{{"", false, false}, {"sharegroup", false, false}, {"kafka", true, false}, {"queue", false, true}} {
		src, err := input.New(runtime.Params{"source": tc.source}, decode, c)
		if tc.bad {
			if !errors.Is(err, runtime.ErrBadParam) {
				t.Errorf("source=%q: %v; want a refusal wrapping ErrBadParam", tc.source, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("source=%q: %v", tc.source, err)
		}
		_, partition := src().(*kafka.Source[string])
		if partition != tc.partition {
			t.Errorf("source=%q: the partition source %v, want %v", tc.source, partition, tc.partition)
		}
	}
	if _, err := input.New(runtime.Params{"source": "kafka", "stop": "soon"}, decode, c); !errors.Is(err, runtime.ErrBadParam) {
		t.Errorf("stop=soon: %v; want a refusal wrapping ErrBadParam", err)
	}
}
