package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"go.uber.org/zap"
)

// discoverLoop finds the partitions this subtask owns, now and every
// discovery interval (once for a bounded source), resolves where new ones
// start (and stop) and hands them to the task goroutine. A failed round is
// retried at the next tick; a deleted topic is an error for the task.
func (s *Source[T]) discoverLoop(ctx context.Context, restored map[tp]int64) {
	defer s.discoveryWG.Done()
	known := map[tp]bool{}
	first := true
	retry := 500 * time.Millisecond
	for {
		f, err := s.discover(ctx, known, restored, first)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !errors.Is(err, ErrTopicGone) && !errors.Is(err, ErrOffsetOutOfRange) && !errors.Is(err, ErrUnknownTopic):
			s.log.Warn("partition discovery failed; retrying", zap.Error(err))
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
			retry = min(2*retry, s.cfg.discovery)
			continue
		case err != nil:
			f.err = err
		}
		retry = 500 * time.Millisecond
		select {
		case s.foundc <- f:
		case <-ctx.Done():
			return
		}
		if f.err != nil || s.cfg.stop != nil {
			return
		}
		for k := range f.parts {
			known[k] = true
		}
		first = false
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.cfg.discovery):
		}
	}
}

// discover is one discovery round: the partitions of the selected topics
// that this subtask owns and known does not hold, with their offsets.
func (s *Source[T]) discover(ctx context.Context, known map[tp]bool, restored map[tp]int64, first bool) (found, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var tds kadm.TopicDetails
	var err error
	if s.cfg.re != nil {
		tds, err = s.adm.ListTopics(ctx)
	} else {
		tds, err = s.adm.ListTopics(ctx, s.cfg.topics...)
	}
	if err != nil {
		return found{}, fmt.Errorf("list topics: %w", err)
	}
	present := map[string]kadm.TopicDetail{}
	for t, td := range tds {
		switch {
		case errors.Is(td.Err, kerr.UnknownTopicOrPartition) && s.cfg.stop != nil:
			return found{}, fmt.Errorf("kafka source: %w: %q: a bounded source would read nothing of it", ErrUnknownTopic, t)
		case errors.Is(td.Err, kerr.UnknownTopicOrPartition):
			if first {
				s.log.Info("topic does not exist (yet): it is read once discovery finds it", zap.String("topic", t))
			}
			continue
		case td.Err != nil:
			return found{}, fmt.Errorf("topic %q: %w", t, td.Err)
		case td.IsInternal || strings.HasPrefix(t, "__"):
			continue
		case s.cfg.re != nil && !s.cfg.re.MatchString(t):
			continue
		}
		present[t] = td
	}
	// Partitions read (or restored) whose topic or partition is gone.
	check := func(k tp) error {
		td, ok := present[k.topic]
		if ok {
			if _, ok = td.Partitions[k.partition]; ok {
				return nil
			}
		}
		if !s.selected(k.topic) {
			return nil
		}
		return fmt.Errorf("kafka source: %w: partition %s (its topic was deleted, or lost partitions); the offsets in state cannot apply to a topic created again", ErrTopicGone, k)
	}
	for k := range known {
		if err := check(k); err != nil {
			return found{}, err
		}
	}
	if first {
		for k := range restored {
			if err := check(k); err != nil {
				return found{}, err
			}
		}
	}
	owned := map[tp]bool{}
	for t, td := range present {
		for p := range td.Partitions {
			k := tp{t, p}
			if !known[k] && Owner(t, p, s.oc.Parallelism) == s.oc.Subtask {
				owned[k] = true
			}
		}
	}
	f := found{parts: map[tp]resolved{}}
	if first {
		for k := range restored {
			if !s.selected(k.topic) {
				s.log.Info("dropping the restored offset of a topic the source no longer reads", zap.Stringer("partition", k))
				f.drop = append(f.drop, k)
			}
		}
	}
	if len(owned) == 0 {
		return f, nil
	}
	if err := s.resolve(ctx, owned, restored, first, f.parts); err != nil {
		return found{}, err
	}
	return f, nil
}

// selected reports whether the source reads topic.
func (s *Source[T]) selected(topic string) bool {
	if s.cfg.re != nil {
		return s.cfg.re.MatchString(topic)
	}
	return slices.Contains(s.cfg.topics, topic)
}

// resolve finds where each partition of owned starts and stops: a restored
// position first; else StartAt on the job's first discovery (no partition
// in restored state), the earliest offset for partitions found later.
// Positions outside the log take the out-of-range policy.
func (s *Source[T]) resolve(ctx context.Context, owned map[tp]bool, restored map[tp]int64, first bool, out map[tp]resolved) error {
	var topics []string
	for k := range owned {
		if !slices.Contains(topics, k.topic) {
			topics = append(topics, k.topic)
		}
	}
	list := func(what string, f func(context.Context, ...string) (kadm.ListedOffsets, error)) (kadm.ListedOffsets, error) {
		l, err := f(ctx, topics...)
		if err == nil {
			err = l.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("list %s offsets: %w", what, err)
		}
		// A partition the listing lacks (its topic's metadata named
		// fewer partitions, as a broker just restarted can answer) has no
		// offset: Lookup's zero would read as offset 0, a stop offset that
		// ends a restored partition unread or a position out of range.
		for k := range owned {
			if _, ok := l.Lookup(k.topic, k.partition); !ok {
				return nil, fmt.Errorf("list %s offsets: partition %s/%d not in the listing (retried)", what, k.topic, k.partition)
			}
		}
		return l, nil
	}
	starts, err := list("start", s.adm.ListStartOffsets)
	if err != nil {
		return err
	}
	ends, err := list("end", s.adm.ListEndOffsets)
	if err != nil {
		return err
	}
	stable, err := list("last stable", s.adm.ListCommittedOffsets)
	if err != nil {
		return err
	}
	// One listing per timestamp (a start and a stop may name two) serves
	// every partition.
	byTime := map[int64]kadm.ListedOffsets{}
	at := func(o Offset, k tp, committed kadm.OffsetResponses) (int64, error) {
		switch o.kind {
		case offsetLatest:
			l, _ := stable.Lookup(k.topic, k.partition)
			return l.Offset, nil
		case offsetTimestamp:
			ms := o.ts.UnixMilli()
			l, ok := byTime[ms]
			if !ok {
				var err error
				l, err = list("timestamp", func(ctx context.Context, ts ...string) (kadm.ListedOffsets, error) {
					return s.adm.ListOffsetsAfterMilli(ctx, ms, ts...)
				})
				if err != nil {
					return 0, err
				}
				byTime[ms] = l
			}
			lo, _ := l.Lookup(k.topic, k.partition)
			if lo.Offset < 0 {
				e, _ := ends.Lookup(k.topic, k.partition)
				return e.Offset, nil
			}
			return lo.Offset, nil
		case offsetExact:
			if off, ok := o.offsets[k.topic][k.partition]; ok {
				return off, nil
			}
			return -1, nil
		case offsetCommitted:
			if c, ok := committed.Lookup(k.topic, k.partition); ok && c.Err == nil && c.At >= 0 {
				return c.At, nil
			}
			return -2, nil
		}
		l, _ := starts.Lookup(k.topic, k.partition)
		return l.Offset, nil
	}
	var committed kadm.OffsetResponses
	startAt := s.cfg.start
	if !first || s.restoredAny {
		startAt = Earliest()
	}
	if startAt.kind == offsetCommitted {
		if committed, err = s.adm.FetchOffsets(ctx, s.cfg.group); err != nil {
			return fmt.Errorf("fetch the committed offsets of group %q: %w", s.cfg.group, err)
		}
	}
	for k := range owned {
		lo, _ := starts.Lookup(k.topic, k.partition)
		hi, _ := ends.Lookup(k.topic, k.partition)
		start, ok := restored[k]
		if !ok {
			var err error
			if start, err = at(startAt, k, committed); err != nil {
				return err
			}
			switch {
			case start == -2: // no committed offset: the fallback
				if start, err = at(*startAt.fallback, k, nil); err != nil {
					return err
				}
			}
			if start == -1 { // not in AtOffsets: the earliest
				start = lo.Offset
			}
		}
		if start < lo.Offset || start > hi.Offset {
			if start, err = s.outOfRange(k, start, lo.Offset, hi.Offset); err != nil {
				return err
			}
		}
		stop := int64(-1)
		if s.cfg.stop != nil {
			if stop, err = at(*s.cfg.stop, k, nil); err != nil {
				return err
			}
			if stop < 0 { // not in AtOffsets: the latest
				l, _ := stable.Lookup(k.topic, k.partition)
				stop = l.Offset
			}
		}
		ls, _ := stable.Lookup(k.topic, k.partition)
		out[k] = resolved{start: start, stop: stop, stable: ls.Offset}
	}
	return nil
}
