package acklog

import (
	"errors"
	"strings"
	"sync"
	"testing"
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
