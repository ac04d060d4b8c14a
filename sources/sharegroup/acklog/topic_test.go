package acklog

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

func TestTopicForIsLegalAndDistinct(t *testing.T) {
	long := strings.Repeat("g", 300)
	tests := []struct {
		group string
		want  string // "" = only check legality
	}{
		{"wordcount", "__weir-acklog-wordcount"},
		{"Word-Count-2", "__weir-acklog-Word-Count-2"},
		{"a.b", "__weir-acklog-a_2Eb"},
		{"a_b", "__weir-acklog-a_5Fb"},
		{"a b/ü", "__weir-acklog-a_20b_2F_C3_BC"},
		{"", "__weir-acklog-"},
		{long, ""},
		{long + "x", ""},
		{strings.Repeat("_", 200), ""},
	}
	seen := map[string]string{}
	for _, tt := range tests {
		got := TopicFor(tt.group)
		if tt.want != "" && got != tt.want {
			t.Errorf("TopicFor(%q) = %q, want %q", tt.group, got, tt.want)
		}
		if err := validTopic(got); err != nil {
			t.Errorf("TopicFor(%q) = %q is not a legal topic: %v", tt.group, got, err)
		}
		if !strings.HasPrefix(got, TopicPrefix) {
			t.Errorf("TopicFor(%q) = %q lacks prefix %q", tt.group, got, TopicPrefix)
		}
		if other, dup := seen[got]; dup {
			t.Errorf("TopicFor(%q) = TopicFor(%q) = %q", tt.group, other, got)
		}
		seen[got] = tt.group
	}
	// Escaping must not let "a.b" and the literal "a_2Eb" collide.
	if TopicFor("a.b") == TopicFor("a_2Eb") {
		t.Error(`TopicFor("a.b") collides with TopicFor("a_2Eb")`)
	}
}

func TestEnsureTopicCreatesOneCompactedPartition(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	adm := f.admin()
	topic := TopicFor("wc")
	if err := EnsureTopic(ctx, adm, topic); err != nil {
		t.Fatalf("EnsureTopic: %v", err)
	}
	n, err := partitionCount(ctx, adm, topic)
	if err != nil || n != 1 {
		t.Fatalf("partitions = %d, %v; want 1", n, err)
	}
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		t.Fatalf("DescribeTopicConfigs: %v", err)
	}
	rc, err := rcs.On(topic, nil)
	if err != nil {
		t.Fatalf("configs of %q: %v", topic, err)
	}
	var policy string
	for _, c := range rc.Configs {
		if c.Key == "cleanup.policy" {
			policy = c.MaybeValue()
		}
	}
	if policy != "compact" {
		t.Fatalf("cleanup.policy = %q, want compact", policy)
	}

	// Idempotent, also when called concurrently.
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { errs[i] = EnsureTopic(ctx, adm, topic) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("repeated EnsureTopic %d: %v", i, err)
		}
	}
	if n, err := partitionCount(ctx, adm, topic); err != nil || n != 1 {
		t.Fatalf("after repeats: partitions = %d, %v; want 1", n, err)
	}
}

func TestEnsureTopicCreatesConcurrentlyOnce(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		adm := f.admin()
		wg.Go(func() { errs[i] = EnsureTopic(ctx, adm, "race") })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent EnsureTopic %d: %v", i, err)
		}
	}
}

func TestEnsureTopicRefusesBadTopics(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	adm := f.admin()
	if _, err := adm.CreateTopic(ctx, 3, 1, nil, "wide"); err != nil {
		t.Fatalf("create wide topic: %v", err)
	}
	for _, topic := range []string{"wide", "", "..", "bad/name", strings.Repeat("x", 250)} {
		err := EnsureTopic(ctx, adm, topic)
		if !errors.Is(err, ErrBadTopic) {
			t.Errorf("EnsureTopic(%.20q) = %v, want ErrBadTopic", topic, err)
		}
	}
	if n, err := partitionCount(ctx, adm, "wide"); err != nil || n != 3 {
		t.Fatalf("wide topic changed: %d partitions, %v", n, err)
	}
}

func TestNewIndexRefusesMissingOrWideTopic(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	if _, err := f.admin().CreateTopic(ctx, 2, 1, nil, "wide"); err != nil {
		t.Fatalf("create wide topic: %v", err)
	}
	for _, topic := range []string{"wide", "missing"} {
		ix, err := NewIndex(ctx, f.seeds, topic)
		if !errors.Is(err, ErrBadTopic) {
			if ix != nil {
				ix.Close()
			}
			t.Errorf("NewIndex(%q) error = %v, want ErrBadTopic", topic, err)
		}
	}
}

// An ack-log EnsureTopic creates keeps tombstones DeleteRetention (the
// savepoint restore check's horizon), and CheckDeleteRetention says so;
// one created otherwise (Kafka's default of a day, or an operator's
// shorter value) is reported as short, a longer one is fine.
func TestTheAckLogKeepsTombstonesLongEnoughAndIsChecked(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	adm := f.admin()
	created := TopicFor("retained")
	if err := EnsureTopic(ctx, adm, created); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		topic string
		value *string // delete.retention.ms at creation; nil: the broker's default
	}{{"default-retention", nil}, {"hour-retention", kadm.StringPtr("3600000")}, {"month-retention", kadm.StringPtr("2592000000")}} {
		configs := map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}
		if c.value != nil {
			configs["delete.retention.ms"] = c.value
		}
		if _, err := adm.CreateTopic(ctx, 1, -1, configs, c.topic); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		topic string
		want  time.Duration
		short bool
	}{
		{created, DeleteRetention, false},
		{"default-retention", 24 * time.Hour, true},
		{"hour-retention", time.Hour, true},
		{"month-retention", 30 * 24 * time.Hour, false},
	} {
		d, err := CheckDeleteRetention(ctx, adm, tc.topic)
		if d != tc.want || errors.Is(err, ErrShortDeleteRetention) != tc.short || (err != nil) != tc.short {
			t.Errorf("CheckDeleteRetention(%s) = %v, %v; want %v, short %v", tc.topic, d, err, tc.want, tc.short)
		}
	}
	if _, err := CheckDeleteRetention(ctx, adm, "no-such-topic"); err == nil {
		t.Error("CheckDeleteRetention of a missing topic succeeded")
	}
}
