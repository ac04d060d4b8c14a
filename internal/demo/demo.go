// Package demo owns `streamctl demo`: one command from a fresh clone that
// starts the embedded broker, writes a generated corpus, runs the
// exactly-once wordcount on the in-process mini cluster with one injected
// task failure, and checks the committed output independently.
//
// It only orchestrates: the job is examples/wordcount, the check is
// wordcount.Verify. It must not hold logic that other packages need.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/kafkatxn/committed"
	"github.com/weirstream/weir/runtime"
)

// ErrViolated is returned when the verification finds a duplicate or a loss.
var ErrViolated = errors.New("demo: exactly-once violated")

// ErrBadConfig is wrapped by Run's error for a Config it refuses.
var ErrBadConfig = errors.New("demo: bad configuration")

// Config sizes the demo. Start from DefaultConfig: every field is checked,
// and a zero or negative size is an error, not a default.
type Config struct {
	Lines      int           // lines of generated text
	Partitions int32         // partitions of the input topic
	Timeout    time.Duration // how long the job may take to produce all output
	// Failpoints is a WEIR_FAILPOINTS spec added to the demo's own injected
	// failure; it is checked before anything starts.
	Failpoints string
	Logger     *zap.Logger // nil: no logs
	// Progress, when set, is called every progressEvery while the job runs
	// with a one-line status, and with "" before the next result line is
	// printed (so a live line can be cleared). It must not block.
	Progress func(status string)
}

// DefaultConfig returns the demo's defaults: 20000 lines, 8 partitions, a 3
// minute timeout.
func DefaultConfig() Config {
	return Config{Lines: 20000, Partitions: 8, Timeout: 3 * time.Minute}
}

// validate checks cfg's sizes.
func (cfg Config) validate() error {
	switch {
	case cfg.Lines < 1:
		return fmt.Errorf("%w: --lines %d: want at least 1", ErrBadConfig, cfg.Lines)
	case cfg.Partitions < 1:
		return fmt.Errorf("%w: --partitions %d: want at least 1", ErrBadConfig, cfg.Partitions)
	case cfg.Timeout <= 0:
		return fmt.Errorf("%w: --timeout %v: want a positive duration", ErrBadConfig, cfg.Timeout)
	}
	return nil
}

// failpoints parses the caller's spec and adds the demo's injected task
// failure at failAt.
func (cfg Config) failpoints(failAt int) (*failpoint.Set, error) {
	user, err := failpoint.Parse(cfg.Failpoints)
	if err != nil {
		return nil, fmt.Errorf("%w: %s=%q: %w", ErrBadConfig, failpoint.EnvVar, cfg.Failpoints, err)
	}
	if slices.Contains(user.Names(), failpoint.TaskProcess) {
		return nil, fmt.Errorf("%w: %s=%q: %w: the demo injects %s itself; leave it out", ErrBadConfig, failpoint.EnvVar, cfg.Failpoints,
			failpoint.ErrBadSpec, failpoint.TaskProcess)
	}
	spec := fmt.Sprintf("%s=error@%d", failpoint.TaskProcess, failAt)
	if cfg.Failpoints != "" {
		spec = cfg.Failpoints + "," + spec
	}
	return failpoint.Parse(spec)
}

// progressEvery is how often Run passes its status to Config.Progress.
const progressEvery = 250 * time.Millisecond

// Run runs the demo, printing progress and the verdict to w. A bad Config is
// an error wrapping ErrBadConfig before anything starts.
func Run(ctx context.Context, w io.Writer, cfg Config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	// Check the failpoints before any work: the real spec depends on the
	// corpus, but a bad one is bad at any count.
	if _, err := cfg.failpoints(1); err != nil {
		return err
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	progress := cfg.Progress
	if progress == nil {
		progress = func(string) {}
	}
	dir, err := os.MkdirTemp("", "weir-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	b, err := broker.Start(ctx, broker.Listen("127.0.0.1:0"), broker.DataDir(dir+"/broker"), broker.Logger(cfg.Logger))
	if err != nil {
		return err
	}
	defer b.Close()
	fmt.Fprintf(w, "embedded broker listening on %s\n", b.Addr())

	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.DefaultProduceTopic("lines"))
	if err != nil {
		return err
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, cfg.Partitions, -1, nil, "lines"); err != nil {
		return fmt.Errorf("demo: create input topic: %w", err)
	}
	lines := Corpus(7, cfg.Lines)
	recs := make([]*kgo.Record, len(lines))
	for i, l := range lines {
		recs[i] = kgo.StringRecord(l)
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("demo: produce input: %w", err)
	}
	want := wordcount.Expected(lines)
	total := 0
	for _, n := range want {
		total += n
	}
	fmt.Fprintf(w, "produced %d lines (%d words, %d distinct) to topic lines (%d partitions)\n", len(lines), total, len(want), cfg.Partitions)

	reg := runtime.NewRegistry()
	if err := wordcount.Register(reg); err != nil {
		return err
	}
	job, err := reg.Build(wordcount.Name, map[string]string{"brokers": b.Addr(), runtime.ParamParallelism: "2"})
	if err != nil {
		return err
	}
	// One task failure, a third of the way through the words.
	failAt := max(1, total/3)
	fp, err := cfg.failpoints(failAt)
	if err != nil {
		return err
	}
	if cfg.Failpoints != "" {
		fmt.Fprintf(w, "failpoints from %s: %s\n", failpoint.EnvVar, cfg.Failpoints)
	}
	fmt.Fprintf(w, "running wordcount (exactly-once, parallelism 2, checkpoints every 200ms) with a task failure injected at record %d\n", failAt)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	var res runtime.Result
	store := dir + "/checkpoints"
	go func() {
		var err error
		res, err = runtime.NewMiniCluster(runtime.CheckpointInterval(200*time.Millisecond), runtime.CheckpointDir(store),
			runtime.Failpoints(fp), runtime.Logger(cfg.Logger), runtime.Restarts(3, 100*time.Millisecond)).Run(runCtx, job)
		done <- err
	}()
	start := time.Now()
	deadline := time.After(cfg.Timeout)
	// The admin client for the progress line must not cache the output
	// topic's metadata from before the job created it.
	admCl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.MetadataMinAge(progressEvery))
	if err != nil {
		return err
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	for {
		if done, err := committed.Reached(ctx, []string{b.Addr()}, "counts", total); err == nil && done {
			break
		}
		progress(fmt.Sprintf("wordcount: %s, about %d of %d output records committed",
			time.Since(start).Round(100*time.Millisecond), committedBound(ctx, adm, "counts", total), total))
		select {
		case err := <-done:
			progress("")
			return fmt.Errorf("demo: job stopped before its output was complete: %w", err)
		case <-deadline:
			progress("")
			return fmt.Errorf("demo: output incomplete after %v (want %d records)", cfg.Timeout, total)
		case <-ctx.Done():
			progress("")
			return ctx.Err()
		case <-time.After(progressEvery):
		}
	}
	progress("")
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	fmt.Fprintf(w, "output complete after %.1fs; the job restarted %d time(s) from its latest checkpoint\n",
		time.Since(start).Seconds(), res.Restarts)
	if fp.Hits(failpoint.TaskProcess) < int64(failAt) {
		return fmt.Errorf("demo: the injected failure never fired")
	}

	rep, err := wordcount.Verify(ctx, []string{b.Addr()}, "counts", want)
	if err != nil {
		return fmt.Errorf("demo: verify: %w", err)
	}
	fmt.Fprintln(w, rep)
	if !rep.OK() {
		return ErrViolated
	}
	return nil
}

// committedBound returns the sum of topic's last stable offsets, at most max:
// an estimate of its committed records for the progress line (transaction
// markers take offsets too), 0 when the topic is not there yet.
func committedBound(ctx context.Context, adm *kadm.Client, topic string, max int) int {
	offs, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		return 0
	}
	var n int64
	offs.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			n += o.Offset
		}
	})
	return int(min(n, int64(max)))
}

// Corpus generates n deterministic lines over a small vocabulary, mixed case.
func Corpus(seed int64, n int) []string {
	words := strings.Fields(`stream barrier checkpoint kafka share group record offset epoch commit abort
		marker lane lock broker topic partition transaction state key value window count word Weir Flink`)
	r := rand.New(rand.NewSource(seed))
	lines := make([]string, n)
	var b strings.Builder
	for i := range lines {
		b.Reset()
		for k, m := 0, 3+r.Intn(10); k < m; k++ {
			if k > 0 {
				b.WriteByte(' ')
			}
			w := words[r.Intn(len(words))]
			if r.Intn(4) == 0 {
				w = strings.ToUpper(w)
			}
			b.WriteString(w)
		}
		lines[i] = b.String()
	}
	return lines
}
