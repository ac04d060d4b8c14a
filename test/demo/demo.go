// Package demo owns `streamctl demo`: one command from a fresh clone that
// starts a cluster as real processes (the embedded broker, a job manager,
// two task managers), writes a generated corpus while the exactly-once
// wordcount runs on it, SIGKILLs a task manager once output is committed,
// and checks the committed output independently.
//
// It only orchestrates: the job is examples/wordcount, the processes are
// streamctl's own commands, the check is wordcount.Verify. It must not hold
// logic that other packages need.
package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/kafkatxn/committed"
	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
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
	// Exe is the streamctl binary whose commands the demo runs as
	// processes (streamctl demo: itself).
	Exe string
	// Failpoints is a WEIR_FAILPOINTS spec for the cluster's processes; it
	// is checked before anything starts.
	Failpoints string
	Logger     *zap.Logger // nil: no logs
	// Stderr receives the processes' logs (warnings and errors; nil:
	// discarded), in LogFormat (console or json; "": console). Run
	// serialises the processes' writes to it.
	Stderr    io.Writer
	LogFormat string
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

// validate checks cfg.
func (cfg Config) validate() error {
	switch {
	case cfg.Lines < 1:
		return fmt.Errorf("%w: --lines %d: want at least 1", ErrBadConfig, cfg.Lines)
	case cfg.Partitions < 1:
		return fmt.Errorf("%w: --partitions %d: want at least 1", ErrBadConfig, cfg.Partitions)
	case cfg.Timeout <= 0:
		return fmt.Errorf("%w: --timeout %v: want a positive duration", ErrBadConfig, cfg.Timeout)
	case cfg.Exe == "":
		return fmt.Errorf("%w: no streamctl binary to run the cluster's processes with", ErrBadConfig)
	}
	if _, err := failpoint.Parse(cfg.Failpoints); err != nil {
		return fmt.Errorf("%w: %s=%q: %w", ErrBadConfig, failpoint.EnvVar, cfg.Failpoints, err)
	}
	return nil
}

// progressEvery is how often Run passes its status to Config.Progress.
const progressEvery = 250 * time.Millisecond

// awaitTaskManagers polls the job manager's GET /taskmanagers until n
// task managers are registered.
func awaitTaskManagers(ctx context.Context, httpAddr string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	hc := &http.Client{}
	defer hc.CloseIdleConnections()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/taskmanagers", nil)
		if err != nil {
			return err
		}
		var got []struct {
			State string `json:"state"`
		}
		resp, err := hc.Do(req)
		if err == nil {
			var list struct {
				TaskManagers []struct {
					State string `json:"state"`
				} `json:"taskmanagers"`
			}
			err = json.NewDecoder(resp.Body).Decode(&list)
			resp.Body.Close()
			for _, tm := range list.TaskManagers {
				if tm.State == "REGISTERED" {
					got = append(got, tm)
				}
			}
		}
		switch {
		case err != nil:
			last = err
		case len(got) >= n:
			return nil
		default:
			last = fmt.Errorf("%d of %d registered", len(got), n)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("demo: task managers did not register: %w", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// proc is one process of the demo's cluster.
type proc struct {
	name  string
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}
}

// start runs cfg.Exe args as the process name.
func (cfg Config) start(name string, args ...string) (*proc, error) {
	format := cfg.LogFormat
	if format == "" {
		format = "console"
	}
	p := &proc{name: name, cmd: exec.Command(cfg.Exe, append(args, "--log-level", "warn", "--log-format", format)...),
		lines: make(chan string, 8), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), failpoint.EnvVar+"="+cfg.Failpoints)
	p.cmd.Stderr = cfg.Stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("demo: start %s: %w", name, err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
		_ = p.cmd.Wait()
	}()
	return p, nil
}

// line waits for the process's next stdout line and returns re's group.
func (p *proc) line(re string) (string, error) {
	select {
	case l := <-p.lines:
		if m := regexp.MustCompile(re).FindStringSubmatch(l); m != nil {
			return m[1], nil
		}
		return "", fmt.Errorf("demo: %s printed %q, want %s", p.name, l, re)
	case <-p.done:
		return "", fmt.Errorf("demo: %s exited: %v", p.name, p.cmd.ProcessState)
	case <-time.After(30 * time.Second):
		return "", fmt.Errorf("demo: %s printed nothing in 30s", p.name)
	}
}

func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop stops the process cleanly (SIGTERM), killing it after 30s.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.kill()
	}
}

// Run runs the demo, printing progress and the verdict to w. A bad Config is
// an error wrapping ErrBadConfig before anything starts.
func Run(ctx context.Context, w io.Writer, cfg Config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Stderr != nil {
		// The processes write their logs concurrently, each from its own
		// copying goroutine in os/exec: one lock serialises them.
		cfg.Stderr = zapcore.Lock(zapcore.AddSync(cfg.Stderr))
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
	var procs []*proc
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].stop()
		}
	}()
	start := func(name string, args ...string) (*proc, error) {
		p, err := cfg.start(name, args...)
		if err == nil {
			procs = append(procs, p)
		}
		return p, err
	}

	b, err := start("broker", "broker", "--listen", "127.0.0.1:0", "--data-dir", dir+"/broker")
	if err != nil {
		return err
	}
	brokerAddr, err := b.line(`^broker listening on (\S+)$`)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "embedded broker (process %d) listening on %s\n", b.cmd.Process.Pid, brokerAddr)
	jm, err := start("jobmanager", "jobmanager", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data-dir", dir+"/jobmanager")
	if err != nil {
		return err
	}
	jmAddr, err := jm.line(`^jobmanager listening on (\S+)$`)
	if err != nil {
		return err
	}
	jmHTTP, err := jm.line(`^jobmanager http on (\S+)$`)
	if err != nil {
		return err
	}
	var tms []*proc
	for i := 1; i <= 2; i++ {
		tm, err := start(fmt.Sprintf("demo-tm-%d", i), "taskmanager", "--jobmanager", jmAddr, "--slots", "2", "--id", fmt.Sprintf("demo-tm-%d", i))
		if err != nil {
			return err
		}
		tms = append(tms, tm)
	}
	// Both task managers register before the submit, so the job's two
	// subtasks are spread over them and the kill below hits one.
	if err := awaitTaskManagers(ctx, jmHTTP, len(tms)); err != nil {
		return err
	}
	fmt.Fprintf(w, "job manager (process %d) on %s, task managers demo-tm-1 (process %d) and demo-tm-2 (process %d), 2 slots each\n",
		jm.cmd.Process.Pid, jmAddr, tms[0].cmd.Process.Pid, tms[1].cmd.Process.Pid)
	if cfg.Failpoints != "" {
		fmt.Fprintf(w, "failpoints from %s: %s\n", failpoint.EnvVar, cfg.Failpoints)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokerAddr), kgo.DefaultProduceTopic("lines"))
	if err != nil {
		return err
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, cfg.Partitions, -1, nil, "lines"); err != nil {
		return fmt.Errorf("demo: create input topic: %w", err)
	}
	lines := Corpus(7, cfg.Lines)
	want := wordcount.Expected(lines)
	total := 0
	for _, n := range want {
		total += n
	}
	// A quarter of the input now, the rest while the job runs: the task
	// manager is killed mid-stream.
	produce := func(ls []string) error {
		recs := make([]*kgo.Record, len(ls))
		for i, l := range ls {
			recs[i] = kgo.StringRecord(l)
		}
		return cl.ProduceSync(ctx, recs...).FirstErr()
	}
	first := max(1, len(lines)/4)
	if err := produce(lines[:first]); err != nil {
		return fmt.Errorf("demo: produce input: %w", err)
	}

	cc, err := rpc.Dial(jmAddr)
	if err != nil {
		return err
	}
	defer cc.Close()
	jmc := weirpb.NewJobManagerClient(cc)
	id, err := submit(ctx, jmc, brokerAddr)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "submitted wordcount as job %s (exactly-once, parallelism 2, checkpoints every 200ms)\n", id)
	produced := make(chan error, 1)
	go func() {
		rest := lines[first:]
		step := max(1, len(rest)/30)
		for len(rest) > 0 {
			n := min(step, len(rest))
			if err := produce(rest[:n]); err != nil {
				produced <- err
				return
			}
			rest = rest[n:]
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				produced <- ctx.Err()
				return
			}
		}
		produced <- nil
	}()
	fmt.Fprintf(w, "producing %d lines (%d words, %d distinct) to topic lines (%d partitions) while the job runs\n",
		len(lines), total, len(want), cfg.Partitions)

	runStart := time.Now()
	deadline := time.After(cfg.Timeout)
	// The admin client for the progress line must not cache the output
	// topic's metadata from before the job created it.
	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokerAddr), kgo.MetadataMinAge(progressEvery))
	if err != nil {
		return err
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	killed := false
	var before int
	for {
		st, err := jmc.GetJob(ctx, &weirpb.GetJobRequest{JobId: id})
		if err != nil {
			return fmt.Errorf("demo: job status: %w", err)
		}
		if st.State == "FAILED" {
			progress("")
			return fmt.Errorf("demo: the job failed: %s", st.Error)
		}
		if !killed && st.LastCompletedCheckpoint > 0 {
			recs, err := committed.Read(ctx, []string{brokerAddr}, "counts")
			if err == nil && len(recs) > 0 {
				progress("")
				tms[0].kill()
				killed, before = true, len(recs)
				// The status read above is older than the read of the
				// output: checkpoints completed meanwhile. The latest
				// completed at the kill is known only after it.
				at, err := jmc.GetJob(ctx, &weirpb.GetJobRequest{JobId: id})
				if err != nil {
					return fmt.Errorf("demo: job status: %w", err)
				}
				fmt.Fprintf(w, "SIGKILLed task manager demo-tm-1 with %d of %d output records already committed (checkpoint %d completed)\n",
					before, total, at.LastCompletedCheckpoint)
				if err := awaitRestart(ctx, jmc, id, at.LastCompletedCheckpoint, w); err != nil {
					return err
				}
			}
		}
		if killed {
			if done, err := committed.Reached(ctx, []string{brokerAddr}, "counts", total); err == nil && done {
				break
			}
		}
		progress(fmt.Sprintf("wordcount: %s, %s, about %d of %d output records committed",
			time.Since(runStart).Round(100*time.Millisecond), st.State, committedBound(ctx, adm, "counts", total), total))
		select {
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
	if err := <-produced; err != nil {
		return fmt.Errorf("demo: produce input: %w", err)
	}
	if before >= total {
		return fmt.Errorf("demo: the whole output was committed before the task manager was killed")
	}
	st, err := jmc.CancelJob(ctx, &weirpb.CancelJobRequest{JobId: id})
	if err != nil {
		return fmt.Errorf("demo: cancel: %w", err)
	}
	fmt.Fprintf(w, "output complete after %.1fs; the job restarted %d time(s); cancelled: %s\n",
		time.Since(runStart).Seconds(), st.Restarts, st.State)
	rep, err := wordcount.Verify(ctx, []string{brokerAddr}, "counts", want)
	if err != nil {
		return fmt.Errorf("demo: verify: %w", err)
	}
	fmt.Fprintln(w, rep)
	if !rep.OK() {
		return ErrViolated
	}
	return nil
}

// submit submits wordcount, retrying while the task managers register.
func submit(ctx context.Context, jmc weirpb.JobManagerClient, brokers string) (string, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := jmc.SubmitJob(ctx, &weirpb.SubmitJobRequest{JobType: wordcount.Name, CheckpointIntervalMs: 200,
			Params: map[string]string{"brokers": brokers, "parallelism": "2"}})
		if err == nil {
			return r.JobId, nil
		}
		if status.Code(err) != codes.FailedPrecondition || time.Now().After(deadline) {
			return "", fmt.Errorf("demo: submit: %w", err)
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// awaitRestart waits until the job runs again after the kill and says
// where it restored from; completed is the latest completed checkpoint
// the job manager knew right after the kill.
func awaitRestart(ctx context.Context, jmc weirpb.JobManagerClient, id string, completed uint64, w io.Writer) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := jmc.GetJob(ctx, &weirpb.GetJobRequest{JobId: id})
		if err != nil {
			return fmt.Errorf("demo: job status: %w", err)
		}
		if st.Restarts > 0 && st.State == "RUNNING" {
			note := ""
			if st.RestoredFromCheckpoint > completed {
				// Every task had acknowledged it, demo-tm-1's before it
				// died: the job manager completed it after the kill.
				note = " (it completed just after the kill: demo-tm-1 had acknowledged it)"
			}
			fmt.Fprintf(w, "the job manager noticed, and restarted the job on demo-tm-2 from checkpoint %d%s\n", st.RestoredFromCheckpoint, note)
			return nil
		}
		if st.State == "FAILED" || time.Now().After(deadline) {
			return fmt.Errorf("demo: the job did not restart after the kill: %s %s", st.State, st.Error)
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
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
