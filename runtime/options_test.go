package runtime

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// An option that cannot work is one clear error when the job starts: no
// record is read and the job is never restarted.
func TestInvalidOptionsFailTheJobAtStart(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  ClusterOpt
		want string
	}{
		{"zero checkpoint interval", CheckpointInterval(0), "CheckpointInterval"},
		{"negative checkpoint timeout", CheckpointTimeout(-time.Second), "CheckpointTimeout"},
		{"negative restarts", Restarts(-1, -time.Second), "Restarts"},
		{"zero batch size", BatchSize(0), "BatchSize"},
		{"negative channel capacity", ChannelCapacity(-3), "ChannelCapacity"},
		{"negative tolerable failures", TolerableCheckpointFailures(-2), "TolerableCheckpointFailures"},
		{"negative min pause", MinPause(-time.Millisecond), "MinPause"},
		{"nil logger", Logger(nil), "Logger"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var emitted atomic.Int64
			src := seqSourceOf(seqSource{keys: 2, splits: 1, n: 10, perPoll: 1, emitted: &emitted})
			txns := newMemTxns()
			// A restart budget, so a failure that restarts would show; the
			// option under test comes last and wins.
			res, err := NewMiniCluster(Restarts(3, time.Millisecond), tc.opt).Run(t.Context(),
				seqJob(src, &violations{}, txns, nil, 1, 1))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v; want an error naming %s", err, tc.want)
			}
			if !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("err = %v; want ErrInvalidOption", err)
			}
			if res.Restarts != 0 || emitted.Load() != 0 || len(txns.output()) != 0 {
				t.Fatalf("%d restarts, %d records read, %d committed: want none", res.Restarts, emitted.Load(), len(txns.output()))
			}
		})
	}
}

// timingSpy is a source that records the checkpoint timing its Open was
// given.
type timingSpy struct {
	Source[seqRec]
	got *checkpoint.Timing
}

func (s timingSpy) Open(ctx context.Context, oc *OperatorContext) error {
	*s.got = oc.Checkpointing
	return s.Source.Open(ctx, oc)
}

// Operators learn the checkpoint timing the job runs with, the effective
// tolerance included: none when a listener may discard aborted work.
func TestOperatorsLearnTheJobsCheckpointTiming(t *testing.T) {
	for _, tc := range []struct {
		name          string
		sink          func(*memTxns) Sink[seqRec]
		wantTolerable int
	}{
		{"carrying sink", func(m *memTxns) Sink[seqRec] { return &txnSink{txns: m} }, checkpoint.DefaultTolerableFailures},
		{"discarding sink", func(m *memTxns) Sink[seqRec] { return abortingSink{&txnSink{txns: m}} }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got checkpoint.Timing
			txns := newMemTxns()
			src := func() Source[seqRec] {
				return timingSpy{seqSourceOf(seqSource{keys: 2, splits: 1, n: 10, perPoll: 1})(), &got}
			}
			_, err := NewMiniCluster(CheckpointInterval(7*time.Millisecond), CheckpointTimeout(3*time.Second), MinPause(time.Millisecond),
				Restarts(2, 50*time.Millisecond)).Run(t.Context(),
				seqJobTo(src, &violations{}, func() Sink[seqRec] { return tc.sink(txns) }, 1, 1))
			if err != nil {
				t.Fatal(err)
			}
			want := checkpoint.Timing{Interval: 7 * time.Millisecond, Timeout: 3 * time.Second, MinPause: time.Millisecond,
				TolerableFailures: tc.wantTolerable, RestartBudget: 50*time.Millisecond + 3*time.Second,
				Failover: checkpoint.Failover{RestartDelay: 50 * time.Millisecond, Recovery: 3 * time.Second}}
			if got != want {
				t.Fatalf("Checkpointing = %+v, want %+v", got, want)
			}
		})
	}
}
