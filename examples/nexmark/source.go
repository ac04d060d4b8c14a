package nexmark

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/runtime"
)

// ErrSourceState is wrapped by the error of a generator source restored from
// state it cannot read.
var ErrSourceState = errors.New("nexmark source: bad state")

// eventsPerPoll is how many events a generator source emits per Poll.
const eventsPerPoll = 256

// Source returns the parallel, checkpointed generator source: subtask i of
// p emits the events numbered i, i+p, i+2p, ... (below cfg.Events when it
// is set, then it ends), each with its time as event timestamp.
//
// Its operator state is one entry per arithmetic progression of event
// numbers still to emit (next number and step), so it restores at any
// parallelism: the progressions are dealt to the new subtasks, and each
// subtask emits its progressions merged by event number, so its timestamps
// never go back. No event is lost or emitted twice across a restore.
func Source(g *Generator) func() runtime.Source[Event] {
	return func() runtime.Source[Event] { return &source{g: g} }
}

type source struct {
	g      *Generator
	splits []split
}

// split is the progression next, next+step, ... of event numbers.
type split struct{ next, step int64 }

func (s *source) Open(_ context.Context, oc *runtime.OperatorContext) error {
	s.splits = nil
	if oc.RestoredFrom == 0 && len(oc.Restored) == 0 {
		s.splits = []split{{next: int64(oc.Subtask), step: int64(oc.Parallelism)}}
		return nil
	}
	for _, e := range oc.Restored {
		next, k := binary.Uvarint(e)
		if k <= 0 {
			return fmt.Errorf("%w: position", ErrSourceState)
		}
		step, k2 := binary.Uvarint(e[k:])
		if k2 <= 0 || k+k2 != len(e) || step == 0 {
			return fmt.Errorf("%w: step", ErrSourceState)
		}
		s.splits = append(s.splits, split{next: int64(next), step: int64(step)})
	}
	return nil
}

// done reports whether n is past the last event.
func (s *source) done(n int64) bool {
	end := s.g.cfg.Events
	return end > 0 && n >= end
}

func (s *source) Poll(_ context.Context, out runtime.Collector[Event]) error {
	tc, ok := out.(runtime.TimestampCollector[Event])
	if !ok {
		return fmt.Errorf("nexmark source: the collector %T takes no timestamps", out)
	}
	for i := 0; i < eventsPerPoll; i++ {
		// The progression with the lowest next number goes first.
		best := -1
		for k, sp := range s.splits {
			if !s.done(sp.next) && (best < 0 || sp.next < s.splits[best].next) {
				best = k
			}
		}
		if best < 0 {
			if i == 0 {
				return runtime.ErrEndOfInput
			}
			return nil
		}
		sp := &s.splits[best]
		tc.CollectWithTimestamp(s.g.Event(sp.next), s.g.Timestamp(sp.next))
		sp.next += sp.step
	}
	return nil
}

func (s *source) Snapshot(context.Context, checkpoint.ID) (runtime.OperatorState, error) {
	var st runtime.OperatorState
	for _, sp := range s.splits {
		if !s.done(sp.next) {
			e := binary.AppendUvarint(nil, uint64(sp.next))
			st.Entries = append(st.Entries, binary.AppendUvarint(e, uint64(sp.step)))
		}
	}
	return st, nil
}

func (s *source) Close() error { return nil }

// Watermarks is the generator source's watermark strategy: its timestamps
// never go back within a subtask.
func Watermarks() runtime.OpOpt {
	return runtime.Watermarks(runtime.ForMonotonousTimestamps[Event]())
}
