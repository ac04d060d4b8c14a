package kafka

import (
	"maps"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// waiting counts, per partition, the records fetched into the consumer
// client and not yet polled: kgo calls its buffered hook once for every
// record it buffers and its unbuffered hook once when that record is
// polled or dropped (an assignment change), so a count is exact once
// those calls are in. A partition with records waiting is not idle, even
// when it emitted nothing for longer than the idleness timeout: its
// records wait behind another partition's in the client (Poll, then
// runtime.SplitCollector.SplitPending; docs/internals/event-time.md).
//
// The counters are found without a lock on the record path: an immutable
// map of topics to per-partition counters, replaced (copied, under mu)
// when a partition is first seen.
type waiting struct {
	mu sync.Mutex
	by atomic.Pointer[map[string][]*atomic.Int64]
}

// OnFetchRecordBuffered implements kgo.HookFetchRecordBuffered.
func (w *waiting) OnFetchRecordBuffered(r *kgo.Record) { w.counter(r.Topic, r.Partition).Add(1) }

// OnFetchRecordUnbuffered implements kgo.HookFetchRecordUnbuffered.
func (w *waiting) OnFetchRecordUnbuffered(r *kgo.Record, _ bool) {
	w.counter(r.Topic, r.Partition).Add(-1)
}

// has reports whether partition k has records waiting in the client.
func (w *waiting) has(k tp) bool {
	m := w.by.Load()
	if m == nil {
		return false
	}
	cs := (*m)[k.topic]
	return int(k.partition) < len(cs) && cs[k.partition] != nil && cs[k.partition].Load() > 0
}

// counter returns the count of topic's partition p, made if new.
func (w *waiting) counter(topic string, p int32) *atomic.Int64 {
	if m := w.by.Load(); m != nil {
		if cs := (*m)[topic]; int(p) < len(cs) && cs[p] != nil {
			return cs[p]
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	old := map[string][]*atomic.Int64{}
	if m := w.by.Load(); m != nil {
		old = *m
	}
	if cs := old[topic]; int(p) < len(cs) && cs[p] != nil {
		return cs[p]
	}
	m := maps.Clone(old)
	cs := make([]*atomic.Int64, max(len(old[topic]), int(p)+1))
	copy(cs, old[topic])
	cs[p] = new(atomic.Int64)
	m[topic] = cs
	w.by.Store(&m)
	return cs[p]
}
