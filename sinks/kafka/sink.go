package kafka

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/runtime"
)

// SinkOpt configures a Sink beyond the TxnWriter options.
type SinkOpt func(*sinkCfg)

type sinkCfg struct {
	tolerateLoss bool
}

// TolerateLostTransactions makes a sink whose restored transactions were
// lost (aborted by the broker's transaction timeout) log the loss and go on,
// instead of failing the job. Losing them loses records: opt in knowingly.
func TolerateLostTransactions() SinkOpt { return func(c *sinkCfg) { c.tolerateLoss = true } }

// NewSink returns a runtime sink factory writing the records serialize
// makes. Every subtask gets its own TxnWriter: transactional ids
// "<prefix>-<subtask>-<pool index>", the prefix defaulting to
// "weir-<job>-<operator uid>".
//
// Checkpoint n's barrier pre-commits the subtask's transaction; its
// completion commits it; a restore commits the restored checkpoint's
// transactions again (idempotent) and aborts lingering ones. An aborted
// checkpoint's transaction stays pending and is committed with the next
// completed checkpoint (as Flink's KafkaSink does), so an aborted checkpoint
// loses nothing.
func NewSink[T any](serialize func(T) (*kgo.Record, error), opts []Opt, sopts ...SinkOpt) (func() runtime.Sink[T], error) {
	c := defaultCfg()
	for _, o := range opts {
		o.apply(&c)
	}
	// Subtask and prefix are filled in per subtask; validate the rest now.
	probe := c
	if probe.prefix == "" {
		probe.prefix = "probe"
	}
	if err := probe.validate(); err != nil {
		return nil, err
	}
	if serialize == nil {
		return nil, fmt.Errorf("%w: no serialize function", ErrInvalidConfig)
	}
	var sc sinkCfg
	for _, o := range sopts {
		o(&sc)
	}
	return func() runtime.Sink[T] {
		return &Sink[T]{opts: opts, prefixSet: c.prefix != "", ser: serialize, sc: sc}
	}, nil
}

// Sink is one subtask of a Kafka sink. Build it with NewSink.
type Sink[T any] struct {
	opts      []Opt
	prefixSet bool
	ser       func(T) (*kgo.Record, error)
	sc        sinkCfg
	w         *TxnWriter
	log       *zap.Logger
}

var unsafePrefix = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// Open implements runtime.Sink.
func (s *Sink[T]) Open(ctx context.Context, oc *runtime.OperatorContext) error {
	s.log = oc.Logger
	if s.log == nil {
		s.log = zap.NewNop()
	}
	opts := append([]Opt{Logger(s.log)}, s.opts...)
	if !s.prefixSet {
		opts = append(opts, TransactionalIDPrefix(unsafePrefix.ReplaceAllString("weir-"+oc.Job+"-"+oc.UID, "_")))
	}
	opts = append(opts, Subtask(oc.Subtask, oc.Parallelism))
	var err error
	if s.w, err = NewTxnWriter(ctx, opts...); err != nil {
		return err
	}
	if err := s.w.Recover(ctx, oc.CommitHandles); err != nil {
		if errors.Is(err, ErrTxnLost) && s.sc.tolerateLoss {
			s.log.Error("kafka sink: continuing after LOST transactions (TolerateLostTransactions)", zap.Error(err))
			return nil
		}
		return err
	}
	return nil
}

// Write implements runtime.Sink.
func (s *Sink[T]) Write(ctx context.Context, v T) error {
	r, err := s.ser(v)
	if err != nil {
		return fmt.Errorf("kafka sink: serialize: %w", err)
	}
	return s.w.Write(ctx, r)
}

// Snapshot implements runtime.Sink: flush and pre-commit; the snapshot names
// every transaction still pending.
func (s *Sink[T]) Snapshot(ctx context.Context, id checkpoint.ID) (runtime.OperatorState, error) {
	if _, _, err := s.w.PreCommit(ctx, id); err != nil {
		return runtime.OperatorState{}, err
	}
	return runtime.OperatorState{Handles: s.w.Pending()}, nil
}

// NotifyCheckpointComplete implements checkpoint.Listener.
func (s *Sink[T]) NotifyCheckpointComplete(ctx context.Context, id checkpoint.ID) error {
	return s.w.Commit(ctx, id)
}

// NotifyCheckpointAborted implements checkpoint.Listener: the aborted
// checkpoint's transaction stays pending for the next completed checkpoint.
func (s *Sink[T]) NotifyCheckpointAborted(context.Context, checkpoint.ID) error { return nil }

// Close implements runtime.Sink.
func (s *Sink[T]) Close() error {
	if s.w != nil {
		s.w.Close()
	}
	return nil
}
