package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// ruleCount is what the broadcast test operators emit for a data record:
// how many rules, and their sum, the subtask sees.
type ruleCount struct {
	Key   string
	Rules int
	Sum   int64
}

// keyedRuleApplier keeps every rule (a seqRec) in broadcast state and
// emits, for each data record, the rules it sees; it counts the data
// records of its key in keyed state, to show both restore.
type keyedRuleApplier struct {
	rules *BroadcastState[string, int64]
	seen  *ValueState[int64]
	added *atomic.Int64
}

func (a *keyedRuleApplier) Open(_ context.Context, st *StateRegistry[string], bs *BroadcastRegistry) error {
	var err error
	if a.rules, err = NewBroadcastState[string, int64](bs, "rules", nil, nil); err != nil {
		return err
	}
	a.seen, err = NewValueState[int64](st, "seen", nil)
	return err
}

func (a *keyedRuleApplier) ProcessElement(ctx *KeyedContext[string], v seqRec, out Collector[ruleCount]) error {
	n, _ := a.seen.Value()
	a.seen.Update(n + 1)
	out.Collect(countRules(v.Key, a.rules))
	return nil
}

func (a *keyedRuleApplier) ProcessBroadcastElement(_ *BroadcastContext, r seqRec, _ Collector[ruleCount]) error {
	a.added.Add(1)
	return a.rules.Put(r.Key, r.Seq)
}

func (a *keyedRuleApplier) OnTimer(*KeyedContext[string], int64, Collector[ruleCount]) error {
	return nil
}

func countRules(key string, rules *BroadcastState[string, int64]) ruleCount {
	c := ruleCount{Key: key, Rules: rules.Len()}
	rules.Range(func(_ string, v int64) bool { c.Sum += v; return true })
	return c
}

// ruleApplier is keyedRuleApplier without keys.
type ruleApplier struct {
	rules *BroadcastState[string, int64]
	added *atomic.Int64
}

func (a *ruleApplier) Open(_ context.Context, bs *BroadcastRegistry) error {
	var err error
	a.rules, err = NewBroadcastState[string, int64](bs, "rules", nil, nil)
	return err
}

func (a *ruleApplier) ProcessElement(_ *BroadcastContext, v seqRec, out Collector[ruleCount]) error {
	out.Collect(countRules(v.Key, a.rules))
	return nil
}

func (a *ruleApplier) ProcessBroadcastElement(_ *BroadcastContext, r seqRec, _ Collector[ruleCount]) error {
	a.added.Add(1)
	return a.rules.Put(r.Key, r.Seq)
}

// ruleJob builds rules (broadcast) + data -> the rule applier -> a sink
// into got.
func ruleJob(keyed bool, rules, data func() Source[seqRec], par int, added *atomic.Int64, got *ruleOutputs) *Job {
	j := NewJob("rules", DefaultParallelism(par), MaxParallelism(16))
	rs := FromSource(j, "rules", rules, Parallelism(1))
	ds := FromSource(j, "data", data, Parallelism(1))
	var out *Stream[ruleCount]
	if keyed {
		out = ProcessKeyedBroadcast(KeyBy(ds, func(r seqRec) string { return r.Key }, nil), rs, "apply",
			func() KeyedBroadcastProcessor[string, seqRec, seqRec, ruleCount] {
				return &keyedRuleApplier{added: added}
			})
	} else {
		out = ProcessBroadcast(ds, rs, "apply", func() BroadcastProcessor[seqRec, seqRec, ruleCount] {
			return &ruleApplier{added: added}
		})
	}
	SinkTo(out, "sink", SinkFunc(func(_ context.Context, c ruleCount) error { got.add(c); return nil }))
	return j
}

type ruleOutputs struct {
	mu  sync.Mutex
	got []ruleCount
}

func (o *ruleOutputs) add(c ruleCount) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, c)
}

func (o *ruleOutputs) all() []ruleCount {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]ruleCount(nil), o.got...)
}

// A job's broadcast state restored at a higher or lower parallelism gives
// every new subtask every rule: each data record after the restore sees
// them all, though the rules stream sends nothing more.
func TestBroadcastStateRestoredAtAnotherParallelismHoldsEveryRule(t *testing.T) {
	const rules = 12
	for _, keyed := range []bool{false, true} {
		for _, tc := range []struct{ from, to int }{{2, 3}, {3, 1}, {1, 4}} {
			t.Run(fmt.Sprintf("keyed=%v/%d->%d", keyed, tc.from, tc.to), func(t *testing.T) {
				store, err := checkpoint.OpenStore(t.TempDir())
				if err != nil {
					t.Fatal(err)
				}
				defer store.Close()
				// The rules source updates every rule (key) rules times,
				// one split per rule: the last value of each is rules.
				ruleSrc := func(stall bool) func() Source[seqRec] {
					s := seqSource{keys: rules, splits: rules, n: rules, perPoll: 1}
					if stall {
						s.stallAt = rules
					}
					return seqSourceOf(s)
				}
				// First run: the rules arrive in every subtask; data stalls.
				// Stop it two checkpoints after every subtask has applied
				// every rule update.
				var added atomic.Int64
				got := &ruleOutputs{}
				ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
				defer cancel()
				var after int
				mc := NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond),
					OnCheckpointComplete(func(CheckpointEvent) {
						if added.Load() == int64(rules*rules*tc.from) {
							if after++; after == 2 {
								cancel()
							}
						}
					}))
				data := seqSourceOf(seqSource{keys: 8, splits: 1, n: 1, perPoll: 1, stallAt: 1})
				if _, err := mc.Run(ctx, ruleJob(keyed, ruleSrc(true), data, tc.from, &added, got)); !errors.Is(err, context.Canceled) {
					t.Fatalf("first run: %v", err)
				}
				if t.Context().Err() != nil {
					t.Fatal("test context done")
				}
				// Second run at another parallelism: the rules source has
				// nothing left; 50 data records (several per subtask).
				added.Store(0)
				got = &ruleOutputs{}
				data = seqSourceOf(seqSource{keys: 10, splits: 1, n: 5, perPoll: 1})
				mc = NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond))
				if _, err := mc.Run(t.Context(), ruleJob(keyed, ruleSrc(false), data, tc.to, &added, got)); err != nil {
					t.Fatal(err)
				}
				if added.Load() != 0 {
					t.Fatalf("the rules source sent %d updates after the restore, want none", added.Load())
				}
				out := got.all()
				if len(out) < 10*4 { // the first round may have been in the restored checkpoint
					t.Fatalf("%d data records out, want at least 40", len(out))
				}
				for _, c := range out {
					if c.Rules != rules || c.Sum != rules*rules {
						t.Fatalf("record of %s saw %d rules summing to %d, want %d summing to %d", c.Key, c.Rules, c.Sum, rules, rules*rules)
					}
				}
			})
		}
	}
}

// writingApplier tries to write broadcast state from the data side.
type writingApplier struct{ ruleApplier }

func (a *writingApplier) ProcessElement(_ *BroadcastContext, v seqRec, _ Collector[ruleCount]) error {
	return a.rules.Put(v.Key, v.Seq)
}

// The data side of a broadcast function cannot change broadcast state
// (Flink's ReadOnlyBroadcastState): Put fails with
// ErrBroadcastStateReadOnly; the broadcast side's Put works.
func TestBroadcastStateIsReadOnlyOnTheDataSide(t *testing.T) {
	j := NewJob("ro")
	ds := FromSource(j, "data", seqSourceOf(seqSource{keys: 1, splits: 1, n: 1, perPoll: 1}))
	rs := FromSource(j, "rules", seqSourceOf(seqSource{keys: 1, splits: 1, n: 1, perPoll: 1}))
	var added atomic.Int64
	out := ProcessBroadcast(ds, rs, "apply", func() BroadcastProcessor[seqRec, seqRec, ruleCount] {
		return &writingApplier{ruleApplier{added: &added}}
	})
	h, err := NewOperatorHarness(t.Context(), out, HarnessConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := PushInput(h, 1, seqRec{Key: "r", Seq: 1}, NoTimestamp); err != nil {
		t.Fatalf("broadcast side: %v", err)
	}
	if err := PushInput(h, 0, seqRec{Key: "d", Seq: 1}, NoTimestamp); !errors.Is(err, ErrBroadcastStateReadOnly) {
		t.Fatalf("data side Put: %v, want ErrBroadcastStateReadOnly", err)
	}
}
