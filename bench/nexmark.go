package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"

	"github.com/weirstream/weir/examples/nexmark"
	"github.com/weirstream/weir/runtime"
)

// nexmarkRate is the generator's event-time rate in the benchmark: 10M
// events per second, nexmark-flink's default, so that windows hold as many
// events as in its published runs.
const nexmarkRate = 10_000_000

// nexmarkPar is the parallelism of every operator in the benchmark: one
// subtask per core of the 2-core reference machine.
const nexmarkPar = 2

// EnvNexmarkCPUProfile, when set to a directory, makes the nexmark
// benchmark write a CPU profile of each query's run there
// (nexmark-<query>-<interval>.pprof; with --nexmark-backends,
// nexmark-<query>-<backend>.pprof, written by the run's own process).
const EnvNexmarkCPUProfile = "WEIR_NEXMARK_CPUPROFILE"

// startNexmarkProfile starts a CPU profile of this process into
// EnvNexmarkCPUProfile's directory as name.pprof when it is set; stop
// ends it and closes the file.
func startNexmarkProfile(name string) (stop func(), err error) {
	dir := os.Getenv(EnvNexmarkCPUProfile)
	if dir == "" {
		return func() {}, nil
	}
	f, err := os.Create(filepath.Join(dir, name+".pprof"))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%s: %w", EnvNexmarkCPUProfile, err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// Nexmark runs the Nexmark queries on the mini cluster: the in-process
// generator (parallel source, nexmarkRate events per second of event
// time), the query at parallelism nexmarkPar, a discarding sink, with a
// checkpoint every 10 s and, as a second line, every 1 s. Each line gives
// the events per CPU-second (the process's user plus system time from
// getrusage over the run, so machines with different core counts compare)
// as its value, the events per wall-clock second as events_per_s, and the
// generator alone (the same source into a discarding sink) as the
// baseline: the query's limit in this process.
func Nexmark(ctx context.Context, cfg Config) ([]Line, error) {
	events := int64(cfg.sizeOf(2_000_000, 200_000, 4_000))
	if cfg.NexmarkEvents > 0 {
		events = cfg.NexmarkEvents
	}
	if len(cfg.NexmarkBackends) > 0 {
		return nexmarkStandard(ctx, cfg, events)
	}
	runs := cfg.runsOf(1, 1)
	if _, ok := cpuTime(); !ok {
		return nil, fmt.Errorf("nexmark: no process CPU time on this platform")
	}
	measureRuns := func(query string, interval time.Duration) (Line, error) {
		var perCPU, perWall []float64
		for i := range runs {
			cfg.progress("%s, checkpoint every %s, run %d/%d, %d events", queryName(query), interval, i+1, runs, events)
			wall, cpu, err := nexmarkRun(ctx, cfg, query, events, interval)
			if err != nil {
				return Line{}, fmt.Errorf("%s: %w", queryName(query), err)
			}
			perCPU = append(perCPU, float64(events)/cpu.Seconds())
			perWall = append(perWall, float64(events)/wall.Seconds())
		}
		l := spread(Line{Metric: "events_per_cpu_s"}, perCPU)
		l.EventsPerS = median(perWall)
		l.Note = fmt.Sprintf("%d events (rate %d/s of event time), parallelism %d, checkpoint every %s, discarding sink; events per CPU-second %s, per second %s",
			events, nexmarkRate, nexmarkPar, interval, rates(perCPU), rates(perWall))
		return l, nil
	}
	gen, err := measureRuns("", 10*time.Second)
	if err != nil {
		return nil, err
	}
	gen.Bench = "nexmark-generator"
	out := []Line{gen}
	for _, q := range nexmark.Queries() {
		for _, iv := range []time.Duration{10 * time.Second, time.Second} {
			l, err := measureRuns(q, iv)
			if err != nil {
				return nil, err
			}
			l.Bench = fmt.Sprintf("nexmark-%s-cp%s", q, iv)
			l.Baseline, l.BaselineValue, l.Ratio = "nexmark-generator", gen.Value, l.Value/gen.Value
			out = append(out, l)
		}
	}
	return out, nil
}

func queryName(q string) string {
	if q == "" {
		return "generator alone"
	}
	return q
}

// nexmarkRun runs query ("": none, the generator alone) once and returns
// its wall-clock and process CPU time.
func nexmarkRun(ctx context.Context, cfg Config, query string, events int64, interval time.Duration) (wall, cpu time.Duration, err error) {
	g, err := nexmark.NewGenerator(nexmark.GeneratorConfig{Events: events, Rate: nexmarkRate, BaseTime: nexmark.DefaultBaseTime})
	if err != nil {
		return 0, 0, err
	}
	name := "bench-nexmark-generator"
	if query != "" {
		name = "bench-nexmark-" + query
	}
	j, ev := nexmark.GeneratorJob(name, g, runtime.DefaultParallelism(nexmarkPar))
	if query == "" {
		runtime.SinkTo(ev, "discard", runtime.SinkFunc(func(context.Context, nexmark.Event) error { return nil }))
	} else if err := nexmark.AddQuery(query, ev, nexmark.Sinks{}); err != nil {
		return 0, 0, err
	}
	if query != "" {
		stop, err := startNexmarkProfile(fmt.Sprintf("nexmark-%s-%s", query, interval))
		if err != nil {
			return 0, 0, err
		}
		defer stop()
	}
	c0, _ := cpuTime()
	start := time.Now()
	_, err = runtime.NewMiniCluster(append([]runtime.ClusterOpt{runtime.CheckpointInterval(interval)}, cfg.clusterOpts...)...).Run(ctx, j)
	wall = time.Since(start)
	c1, _ := cpuTime()
	return wall, c1 - c0, err
}
