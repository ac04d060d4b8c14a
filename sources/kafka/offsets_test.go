package kafka

import (
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

// pollAll polls a bounded source until it ends its input.
func pollAll(t *testing.T, s *Source[string]) []string {
	t.Helper()
	c := &sliceCollector{}
	for deadline := time.Now().Add(time.Minute); ; {
		err := s.Poll(t.Context(), c)
		if errors.Is(err, runtime.ErrEndOfInput) {
			return c.vals
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no end of input in a minute (%d records)", len(c.vals))
		}
	}
}

// Start and stop offsets of a bounded read: record i of 20 is in
// partition i mod 2 at offset i/2, stamped base + i seconds; the group
// "g" committed offset 7 of partition 0 only.
func TestStartAndStopOffsets(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 2, nil)
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	produce(t, env, "in", 2, 0, 20, "r", func(i int) int64 { return base.Add(time.Duration(i) * time.Second).UnixMilli() })
	commit := kadm.Offsets{}
	commit.Add(kadm.Offset{Topic: "in", Partition: 0, At: 7, LeaderEpoch: -1})
	if _, err := env.Admin(t).CommitOffsets(t.Context(), "g", commit); err != nil {
		t.Fatal(err)
	}
	rec := func(is ...int) []string {
		var out []string
		for _, i := range is {
			out = append(out, names("r", i, 1)...)
		}
		return out
	}
	for _, tc := range []struct {
		name        string
		start, stop Offset
		want        []string
	}{
		{"earliest to latest", Earliest(), Latest(), names("r", 0, 20)},
		{"from a timestamp", AtTimestamp(base.Add(10 * time.Second)), Latest(), names("r", 10, 10)},
		{"to a timestamp", Earliest(), AtTimestamp(base.Add(10 * time.Second)), names("r", 0, 10)},
		{"given offsets, the others earliest and latest", AtOffsets(map[string]map[int32]int64{"in": {0: 3}}),
			AtOffsets(map[string]map[int32]int64{"in": {1: 4}}), rec(6, 8, 10, 12, 14, 16, 18, 1, 3, 5, 7)},
		{"committed, else latest", Committed(Latest()), Latest(), rec(14, 16, 18)},
		{"latest to latest", Latest(), Latest(), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := openSource(t, env, nil, Topics("in"), Group("g"), StartAt(tc.start), StopAt(tc.stop))
			if err != nil {
				t.Fatal(err)
			}
			sameSet(t, pollAll(t, s), tc.want)
		})
	}
}

// A bounded source given a topic that does not exist fails instead of
// ending at once with nothing read; an unbounded one waits for it.
func TestBoundedSourceFailsOnAnUnknownTopic(t *testing.T) {
	env := kafkatest.New(t)
	s, err := openSource(t, env, nil, Topics("missing"), StopAt(Latest()))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := s.Poll(t.Context(), &sliceCollector{})
		if errors.Is(err, ErrUnknownTopic) {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("Poll: %v; want an error wrapping ErrUnknownTopic", err)
		}
	}
	u, err := openSource(t, env, nil, Topics("later"))
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Poll(t.Context(), &sliceCollector{}); err != nil {
		t.Fatalf("an unbounded source polling a missing topic: %v", err)
	}
	env.CreateTopic(t, "later", 1, nil)
	produce(t, env, "later", 1, 0, 3, "l", nil)
	got, err := pollUntil(t, u, 3)
	if err != nil {
		t.Fatal(err)
	}
	sameSet(t, got, names("l", 0, 3))
}

// Options that cannot work are refused when the job is built.
func TestInvalidOptionsAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Opt
	}{
		{"no brokers", []Opt{Topics("t")}},
		{"no topics", []Opt{Brokers("b")}},
		{"topics and regex", []Opt{Brokers("b"), Topics("t"), TopicRegex("t.*")}},
		{"bad regex", []Opt{Brokers("b"), TopicRegex("(")}},
		{"committed without a group", []Opt{Brokers("b"), Topics("t"), StartAt(Committed(Earliest()))}},
		{"stop at earliest", []Opt{Brokers("b"), Topics("t"), StopAt(Earliest())}},
		{"stop at committed", []Opt{Brokers("b"), Topics("t"), Group("g"), StopAt(Committed(Latest()))}},
		{"zero discovery interval", []Opt{Brokers("b"), Topics("t"), DiscoveryInterval(0)}},
		{"regex without group or dead-letter topic", []Opt{Brokers("b"), TopicRegex("t.*")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(decodeString, tc.opts...); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("New: %v, want an error wrapping ErrInvalidConfig", err)
			}
		})
	}
}

// Owner is Flink's KafkaTopicPartitionAssigner: a topic's partitions go
// round-robin from a start index its name gives, and every partition has
// exactly one owner at any parallelism.
func TestOwnerDealsATopicsPartitionsRoundRobin(t *testing.T) {
	// Flink: ((topic.hashCode() * 31) & 0x7FFFFFFF) % parallelism; "clicks".hashCode() is -1357714453.
	h := int32(-1357714453)
	start := int((h * 31) & 0x7FFFFFFF)
	for par := 1; par <= 7; par++ {
		for p := range int32(12) {
			if got, want := Owner("clicks", p, par), (start%par+int(p))%par; got != want {
				t.Fatalf("Owner(clicks, %d, %d) = %d, want %d", p, par, got, want)
			}
		}
	}
}
