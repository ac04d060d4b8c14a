package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/weirstream/weir/examples/input"
	"github.com/weirstream/weir/examples/nexmark"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup"
)

// NexmarkTopic runs Nexmark's q0 (every event decoded, its bids through) from a
// Kafka topic that nexmark.WriteToKafka (`streamctl nexmark generate`)
// filled, on each source in turn: the partition source (sources/kafka)
// and the share group (exactly-once, CommitWhenIdle), both at parallelism
// nexmarkPar with 100 ms checkpoints, on the same in-process broker and the
// same events (3 runs each, 2 with Quick; each run a group of its own). A
// run's clocks stop when the sink has received every event. The line gives
// the partition source's events per CPU-second (the process's, so the
// in-process broker's work counts on both sides) against the share
// group's, and its events per wall-clock second as events_per_s.
func NexmarkTopic(ctx context.Context, cfg Config) ([]Line, error) {
	events, runs := int64(cfg.sizeOf(400_000, 100_000, 2_000)), cfg.runsOf(3, 2)
	if _, ok := cpuTime(); !ok {
		return nil, fmt.Errorf("nexmark-topic: no process CPU time on this platform")
	}
	kb, err := startBroker(ctx)
	if err != nil {
		return nil, err
	}
	defer kb.Close()
	g, err := nexmark.NewGenerator(nexmark.GeneratorConfig{Events: events, Rate: nexmarkRate, BaseTime: nexmark.DefaultBaseTime})
	if err != nil {
		return nil, err
	}
	cfg.progress("writing %d events", events)
	if err := nexmark.WriteToKafka(ctx, []string{kb.addr}, "bench-nexmark", 8, g, nil); err != nil {
		return nil, err
	}
	bids := int64(0)
	for i := range events {
		if g.Event(i).Type == nexmark.BidEvent {
			bids++
		}
	}
	var wall [2][]float64
	vs, err := alternateSides(runs, func(side string, i int) { cfg.progress("run %d/%d: %s", i+1, runs, side) },
		side{"kafka", func(i int) (float64, error) {
			w, cpu, err := nexmarkTopicRun(ctx, cfg, kb, input.Partitions, i, bids)
			wall[0] = append(wall[0], float64(events)/w.Seconds())
			return float64(events) / cpu.Seconds(), err
		}},
		side{"sharegroup", func(i int) (float64, error) {
			w, cpu, err := nexmarkTopicRun(ctx, cfg, kb, input.ShareGroup, i, bids)
			wall[1] = append(wall[1], float64(events)/w.Seconds())
			return float64(events) / cpu.Seconds(), err
		}})
	if err != nil {
		return nil, err
	}
	l := compared("nexmark-topic-q0-kafka", "events_per_cpu_s", "nexmark-topic-q0-sharegroup", vs[0], vs[1])
	l.EventsPerS = median(wall[0])
	l.Note = fmt.Sprintf("q0 on %d JSON events of a topic (8 partitions, streamctl nexmark generate) on the partition source against "+
		"the share group (exactly-once, CommitWhenIdle(%v)), parallelism %d, 100 ms checkpoints, clocks stop at the last event in the "+
		"sink; process CPU (broker included); events per second: kafka %s, sharegroup %s; %s",
		events, eosIdleCommit, nexmarkPar, rates(wall[0]), rates(wall[1]), l.Note)
	return []Line{l}, nil
}

// nexmarkTopicRun runs q0 from bench-nexmark on source (run-th run: a group
// of its own) until its sink received the topic's bids bids (its last
// result), and returns the wall and process CPU time from the job's start
// until then.
func nexmarkTopicRun(ctx context.Context, cfg Config, kb *kafkaBroker, source string, run int, bids int64) (wall, cpu time.Duration, err error) {
	p := runtime.Params{"source": source, "brokers": kb.addr, "out-of-orderness": "5s", "idle": "10s", "max-drift": "1m",
		runtime.ParamParallelism: strconv.Itoa(nexmarkPar)}
	var opts []sharegroup.Opt
	if source == input.ShareGroup {
		opts = append(opts, sharegroup.CommitWhenIdle(eosIdleCommit))
	}
	src, err := input.New(p, nexmark.ParseEvent, input.Config{Brokers: []string{kb.addr}, Topic: "bench-nexmark",
		Group: fmt.Sprintf("bench-nexmark-%s-%d", source, run), ShareGroupOpts: opts})
	if err != nil {
		return 0, 0, err
	}
	wms, err := input.Watermarks(p, nexmark.Event.Time)
	if err != nil {
		return 0, 0, err
	}
	jopts, err := p.JobOpts()
	if err != nil {
		return 0, 0, err
	}
	j := runtime.NewJob("bench-nexmark-topic", jopts...)
	ev := runtime.FromSource(j, "events", src, runtime.Watermarks(wms))
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var got atomic.Int64
	var c1 time.Duration
	var end time.Time
	if err := nexmark.AddQuery("q0", ev, nexmark.Sinks{Collect: func(any) {
		if got.Add(1) == bids {
			c1, _ = cpuTime()
			end = time.Now()
			cancel()
		}
	}}); err != nil {
		return 0, 0, err
	}
	c0, _ := cpuTime()
	start := time.Now()
	_, err = runtime.NewMiniCluster(append([]runtime.ClusterOpt{runtime.CheckpointInterval(100 * time.Millisecond), runtime.MinPause(0)}, cfg.clusterOpts...)...).Run(rctx, j)
	if n := got.Load(); n != bids {
		return 0, 0, fmt.Errorf("%s: the sink received %d of the %d bids: %w", source, n, bids, err)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return 0, 0, err
	}
	return end.Sub(start), c1 - c0, nil
}
