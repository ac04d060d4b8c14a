// Package input builds the Kafka source of a bundled job (wordcount,
// sessions, nexmark) from its parameters, on either source: the share group
// (sources/sharegroup, the default) or the partition source with offsets in
// checkpoint state (sources/kafka), chosen by the parameter "source". The
// jobs declare Params and call New, so the choice and its parameters are
// read in one place.
//
// Like the jobs it serves, it uses only what a Weir user may use.
package input

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/kafka"
	"github.com/weirstream/weir/sources/sharegroup"
)

// The values of the parameter "source".
const (
	// ShareGroup reads the share group "group" on the input topic.
	ShareGroup = kafka.SourceShareGroup
	// Partitions reads the input topic's partitions with offsets in
	// checkpoint state; "group" is the consumer group its offsets are
	// committed to for monitoring only.
	Partitions = kafka.SourceKafka
)

// Parameter names.
const (
	ParamSource = "source"
	ParamStart  = "start"
	ParamStop   = "stop"
)

// Params are the parameters of the choice of source: "source"
// (sharegroup | kafka), and the partition source's OffsetParams.
func Params() []runtime.ParamSpec {
	return append([]runtime.ParamSpec{SourceParam(ShareGroup + " (a share group on the input topic) or " + Partitions +
		" (its partitions, offsets in checkpoint state: replayable)")}, OffsetParams()...)
}

// OffsetParams are the partition source's parameters "start" and "stop".
func OffsetParams() []runtime.ParamSpec {
	return []runtime.ParamSpec{
		{Name: ParamStart, Default: "earliest", Description: "source=kafka: where a job started without state reads from: " +
			"earliest, latest, committed (the group's committed offsets, earliest where none), a time (RFC 3339 or epoch ms: " +
			"the first offset at or after it), or offsets per partition P=OFFSET,... (earliest for a partition not listed)"},
		{Name: ParamStop, Default: "", Description: "source=kafka: empty (unbounded), or where the job ends FINISHED: latest " +
			"(the end offsets when it starts), a time (RFC 3339 or epoch ms), or offsets per partition P=OFFSET,..."},
	}
}

// SourceParam is the parameter "source" with a description.
func SourceParam(description string) runtime.ParamSpec {
	return runtime.ParamSpec{Name: ParamSource, Default: ShareGroup, Description: description}
}

// Kind returns p's "source": ShareGroup (also when unset) or Partitions.
func Kind(p runtime.Params) (string, error) {
	useKafka, err := kafka.ParamUsesKafka(p)
	if err != nil || !useKafka {
		return ShareGroup, err
	}
	return Partitions, nil
}

// Watermarks is the watermark strategy of an event-time job on p's source,
// from the parameters sharegroup.EventTimeParams declares: bounded
// out-of-orderness on the event time ts gives and idleness, per partition
// on the partition source (which ignores "max-drift": each partition is read
// in order by one subtask), with the share group's alignment on the share
// group.
func Watermarks[T any](p runtime.Params, ts func(T) int64) (runtime.WatermarkStrategy[T], error) {
	kind, err := Kind(p)
	if err != nil {
		return runtime.WatermarkStrategy[T]{}, err
	}
	if kind == Partitions {
		return kafka.ParamWatermarks(p, ts)
	}
	return sharegroup.ParamWatermarks(p, ts)
}

// Config is what a job's source reads, besides its parameters.
type Config struct {
	Brokers []string
	Topic   string
	// Group is the share group (ShareGroup) or the consumer group the
	// offsets are committed to for monitoring (Partitions).
	Group string
	// AtLeastOnce sets the share group's at-least-once mode (no ack-log);
	// the partition source is the same for both guarantees (the sink
	// makes the difference).
	AtLeastOnce bool
	// ShareGroupOpts are added to the share-group source's options.
	ShareGroupOpts []sharegroup.Opt
}

// New returns the source p's "source" chooses, reading c.Topic and
// decoding each record with decode. A record decode fails goes to the
// source's dead-letter topic, "<group>-dlq" on either source.
func New[T any](p runtime.Params, decode func(*kgo.Record) (T, error), c Config) (func() runtime.Source[T], error) {
	kind, err := Kind(p)
	if err != nil {
		return nil, err
	}
	if kind == ShareGroup {
		mode := sharegroup.Transactional
		if c.AtLeastOnce {
			mode = sharegroup.AtLeastOnce
		}
		return sharegroup.New(decode, append([]sharegroup.Opt{sharegroup.Brokers(c.Brokers...), sharegroup.Topics(c.Topic),
			sharegroup.Group(c.Group), sharegroup.Mode(mode)}, c.ShareGroupOpts...)...)
	}
	start, err := Offset(p, ParamStart, c.Topic)
	if err != nil {
		return nil, err
	}
	opts := []kafka.Opt{kafka.Brokers(c.Brokers...), kafka.Topics(c.Topic), kafka.Group(c.Group),
		kafka.StartAt(start), kafka.DeadLetterTopic(c.Group + "-dlq")}
	if p.String(ParamStop) != "" {
		stop, err := Offset(p, ParamStop, c.Topic)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kafka.StopAt(stop))
	}
	return kafka.New(decode, opts...)
}

// Offset parses the offset parameter name of p ("start" or "stop") for
// topic: earliest, latest, committed (start only), a time (RFC 3339, or
// epoch milliseconds) or offsets per partition ("0=100,1=250"). An unset
// start is earliest.
func Offset(p runtime.Params, name, topic string) (kafka.Offset, error) {
	v := strings.TrimSpace(p.String(name))
	bad := func(why string) (kafka.Offset, error) {
		return kafka.Offset{}, fmt.Errorf("%w: %s=%q: %s", runtime.ErrBadParam, name, v, why)
	}
	switch {
	case v == "earliest" || (v == "" && name == ParamStart):
		if name == ParamStop {
			return bad("a job cannot stop at the earliest offsets")
		}
		return kafka.Earliest(), nil
	case v == "latest":
		return kafka.Latest(), nil
	case v == "committed":
		if name == ParamStop {
			return bad("committed is a start, not a stop")
		}
		return kafka.Committed(kafka.Earliest()), nil
	case strings.Contains(v, "="):
		offsets := map[int32]int64{}
		for _, f := range strings.Split(v, ",") {
			ps, offs, ok := strings.Cut(strings.TrimSpace(f), "=")
			part, err1 := strconv.ParseInt(ps, 10, 32)
			off, err2 := strconv.ParseInt(offs, 10, 64)
			if !ok || err1 != nil || err2 != nil || part < 0 || off < 0 {
				return bad("want PARTITION=OFFSET,... with non-negative integers")
			}
			if _, dup := offsets[int32(part)]; dup {
				return bad(fmt.Sprintf("partition %d given twice", part))
			}
			offsets[int32(part)] = off
		}
		return kafka.AtOffsets(map[string]map[int32]int64{topic: offsets}), nil
	}
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
		return kafka.AtTimestamp(time.UnixMilli(ms)), nil
	}
	if ts, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return kafka.AtTimestamp(ts), nil
	}
	return bad("want earliest, latest, committed, a time (RFC 3339 or epoch ms) or PARTITION=OFFSET,...")
}

// Check is a runtime.JobType Check for a job reading Kafka: the share group
// source's broker check (share groups supported), or, for the partition
// source, that the brokers answer; and that the source's parameters parse.
func Check(ctx context.Context, p runtime.Params) error {
	kind, err := Kind(p)
	if err != nil {
		return err
	}
	if kind == ShareGroup {
		return sharegroup.CheckBrokersParam(ctx, p)
	}
	for _, name := range []string{ParamStart, ParamStop} {
		if name == ParamStop && p.String(name) == "" {
			continue
		}
		if _, err := Offset(p, name, ""); err != nil {
			return err
		}
	}
	return CheckReachable(ctx, sharegroup.ParamBrokers(p))
}

// CheckReachable checks that brokers answer a metadata request.
func CheckReachable(ctx context.Context, brokers []string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DisableClientMetrics())
	if err != nil {
		return fmt.Errorf("brokers %v: %w", brokers, err)
	}
	defer cl.Close()
	if err := cl.Ping(ctx); err != nil {
		return fmt.Errorf("brokers %s: %w", strings.Join(brokers, ","), err)
	}
	return nil
}
