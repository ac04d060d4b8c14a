package runtime

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint/storage"
)

// holder's interface field is encodable or not depending on its dynamic
// value, which no build-time check can see.
type holder struct{ V any }

// poisonState keeps a ValueState whose value JSON cannot encode once the
// 5th record of a key arrived: the asynchronous part of every later snapshot
// panics in the codec.
type poisonState struct {
	st *ValueState[holder]
}

func (p *poisonState) Open(_ context.Context, r *StateRegistry[string]) error {
	var err error
	p.st, err = NewValueState[holder](r, "h", JSONCodec[holder]{})
	return err
}

func (p *poisonState) Process(_ string, v seqRec, out Collector[seqRec]) error {
	if v.Seq >= 5 {
		p.st.Update(holder{V: make(chan int)})
	} else {
		p.st.Update(holder{V: v.Seq})
	}
	out.Collect(v)
	return nil
}

// panickyCloseSink panics in Close.
type panickyCloseSink struct{ *txnSink }

func (panickyCloseSink) Close() error { panic("close exploded") }

// Every panic in user code, a codec or Close is a task failure carrying the
// panic, never a crashed process.
func TestPanicsAreTaskFailures(t *testing.T) {
	poison := func(txns *memTxns) *Job {
		j := NewJob("async-panic")
		recs := FromSource(j, "source", seqSourceOf(seqSource{keys: 2, splits: 1, n: 50, perPoll: 1, pollDelay: time.Millisecond}))
		out := Process(KeyBy(recs, func(r seqRec) string { return r.Key }, nil), "poison",
			func() KeyedProcessFunction[string, seqRec, seqRec] { return &poisonState{} })
		SinkTo(out, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} })
		return j
	}
	for _, tc := range []struct {
		name, want string
		build      func(txns *memTxns) *Job
		storage    bool
	}{
		{"codec in the asynchronous snapshot", "JSONCodec cannot encode", poison, false},
		// The heap backend encodes as it writes to checkpoint storage.
		{"codec in the snapshot's upload", "JSONCodec cannot encode", poison, true},
		{"operator Close", "close exploded", func(txns *memTxns) *Job {
			j := NewJob("close-panic")
			recs := FromSource(j, "source", seqSourceOf(seqSource{keys: 2, splits: 1, n: 20, perPoll: 1}))
			SinkTo(recs, "sink", func() Sink[seqRec] { return panickyCloseSink{&txnSink{txns: txns}} })
			return j
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			txns := newMemTxns()
			opts := []ClusterOpt{CheckpointInterval(5 * time.Millisecond), Restarts(0, 0)}
			if tc.storage {
				url := "file://" + t.TempDir()
				st, err := storage.Open(t.Context(), url)
				if err != nil {
					t.Fatal(err)
				}
				defer st.Close()
				opts = append(opts, StateStorage(st, url), StateInlineLimit(-1))
			}
			_, err := NewMiniCluster(opts...).Run(t.Context(), tc.build(txns))
			var pe *panicError
			if !errors.Is(err, ErrJobFailed) || !errors.As(err, &pe) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v; want a job failure carrying the panic %q", err, tc.want)
			}
		})
	}
}

type chanKeyed struct{ C chan int }

type funcState struct {
	F func()
}

// badStateType declares state of a type JSON cannot encode.
type badStateType struct{}

func (badStateType) Open(_ context.Context, r *StateRegistry[string]) error {
	_, err := NewValueState[funcState](r, "f", nil)
	return err
}

func (badStateType) Process(string, seqRec, Collector[seqRec]) error { return nil }

// A key or state type the default codec cannot encode is refused when the
// job is built (or, for state declared in Open, when it opens, before any
// record is read), without a restart.
func TestUnsupportedStateTypesAreRejectedUpFront(t *testing.T) {
	var emitted atomic.Int64
	src := seqSourceOf(seqSource{keys: 2, splits: 1, n: 20, perPoll: 1, emitted: &emitted})
	for _, tc := range []struct {
		name  string
		build func() *Job
	}{
		{"KeyBy with a channel key", func() *Job {
			j := NewJob("chan-key")
			recs := FromSource(j, "source", src)
			ks := KeyBy(recs, func(seqRec) chanKeyed { return chanKeyed{} }, nil)
			SinkTo(Process(ks, "p", func() KeyedProcessFunction[chanKeyed, seqRec, seqRec] {
				return ProcessFunc[chanKeyed, seqRec, seqRec](func(chanKeyed, seqRec, Collector[seqRec]) error { return nil })
			}), "sink", func() Sink[seqRec] { return &txnSink{txns: newMemTxns()} })
			return j
		}},
		{"Reduce of a struct with a func field", func() *Job {
			j := NewJob("func-reduce")
			recs := Map(FromSource(j, "source", src), "wrap", func(seqRec) (funcState, error) { return funcState{}, nil })
			Reduce(KeyBy(recs, func(funcState) string { return "k" }, nil), "r",
				func(a, b funcState) (funcState, error) { return b, nil }, nil)
			return j
		}},
		{"ValueState of a struct with a func field", func() *Job {
			j := NewJob("func-state")
			recs := FromSource(j, "source", src)
			Process(KeyBy(recs, func(r seqRec) string { return r.Key }, nil), "p",
				func() KeyedProcessFunction[string, seqRec, seqRec] { return badStateType{} })
			return j
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			emitted.Store(0)
			res, err := NewMiniCluster(CheckpointInterval(5*time.Millisecond)).Run(t.Context(), tc.build())
			if !errors.Is(err, ErrInvalidJob) || !errors.Is(err, ErrUnsupportedType) {
				t.Fatalf("err = %v; want ErrInvalidJob and ErrUnsupportedType", err)
			}
			if res.Restarts != 0 || emitted.Load() != 0 {
				t.Fatalf("%d restarts, %d records read: want none", res.Restarts, emitted.Load())
			}
		})
	}
}
