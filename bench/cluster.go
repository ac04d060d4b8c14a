package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/jobmanager"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/taskmanager"
)

// runtime-wordcount-2tm: the runtime-wordcount job submitted to a job
// manager and run across two task managers (separate processes under
// `streamctl bench`: Config.TaskManagers), so that every word crosses the
// data plane between them once in two, against the same job on the
// in-process mini cluster, alternately.

// JobTypeWordcount is the job type name of the benchmark's in-memory
// wordcount, as task managers that run runtime-wordcount-2tm register it
// (JobTypes).
const JobTypeWordcount = "bench-wordcount"

// JobTypes are the job types benchmark task managers register: the
// exactly-once wordcount (examples/wordcount, for recovery) and the
// in-memory wordcount of runtime-wordcount-2tm, whose corpus
// is generated when a source subtask is created, once per process and
// size, so building the job (at submit, and on every task manager) costs
// nothing and runs after the first measure no generation.
func JobTypes() []runtime.JobType {
	var mu sync.Mutex
	corpora := map[int][]string{}
	corpus := func(n int) []string {
		mu.Lock()
		defer mu.Unlock()
		if corpora[n] == nil {
			corpora[n] = Corpus(1, n, 10, 20_000)
		}
		return corpora[n]
	}
	return []runtime.JobType{wordcount.Type, {
		Name:        JobTypeWordcount,
		Description: "the runtime-wordcount benchmark's in-memory wordcount (a generated corpus; the sinks count)",
		Params: []runtime.ParamSpec{
			{Name: "lines", Default: "1000", Description: "lines of the generated corpus"},
		},
		Build: func(p runtime.Params) (*runtime.Job, error) {
			n, err := p.Int("lines")
			if err != nil {
				return nil, err
			}
			j, _ := wordcountJob(func() runtime.Source[string] { return runtime.SliceSource(corpus(n), 64)() })
			return j, nil
		},
	}}
}

// StartTaskManagers starts n task managers registered with the job manager
// at jmAddr, each offering one slot and registering JobTypes; stop stops
// them and waits until they exited.
type StartTaskManagers func(ctx context.Context, jmAddr string, n int) (stop func(), err error)

// inProcessTaskManagers is the StartTaskManagers of tests: task managers
// in this process, talking to the job manager and each other over loopback
// as processes do.
func inProcessTaskManagers(ctx context.Context, jmAddr string, n int) (func(), error) {
	reg, err := Registry()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = taskmanager.Run(ctx, jmAddr, taskmanager.ID("bench-tm-"+strconv.Itoa(i+1)), taskmanager.Slots(1), taskmanager.Jobs(reg))
		}()
	}
	return func() { cancel(); wg.Wait() }, nil
}

// Registry returns a registry of JobTypes.
func Registry() (*runtime.Registry, error) {
	reg := runtime.NewRegistry()
	for _, t := range JobTypes() {
		if err := reg.Register(t); err != nil {
			return nil, err
		}
	}
	return reg, nil
}

// RuntimeWordcount2TM measures runtime-wordcount across two task managers
// against the mini cluster, in words per second (5 runs each, 2 with
// Quick).
func RuntimeWordcount2TM(ctx context.Context, cfg Config) ([]Line, error) {
	lines, runs := cfg.sizeOf(400_000, 150_000, 20_000), cfg.runsOf(5, 2)
	corpus := Corpus(1, lines, 10, 20_000)
	var words int64
	for _, l := range corpus {
		words += int64(len(strings.Fields(l)))
	}
	jm, err := startJobManager(ctx)
	if err != nil {
		return nil, err
	}
	defer jm.Close()
	srv := jm.srv
	start := cfg.TaskManagers
	where := "task-manager processes"
	if start == nil {
		start, where = inProcessTaskManagers, "in-process task managers"
	}
	stopTMs, err := start(ctx, jm.addr, 2)
	if err != nil {
		return nil, fmt.Errorf("start task managers: %w", err)
	}
	defer stopTMs()
	if err := waitSlots(ctx, srv, 2); err != nil {
		return nil, err
	}
	// A first, unmeasured run: the task managers generate the corpus.
	if _, err := clusterWordcount(ctx, srv, lines, words); err != nil {
		return nil, err
	}
	cluster, mini, err := alternate(runs, func(side string, i int) { cfg.progress("run %d/%d: %s", i+1, runs, side) },
		func(int) (float64, error) {
			el, err := clusterWordcount(ctx, srv, lines, words)
			return float64(words) / el.Seconds(), err
		},
		func(int) (float64, error) {
			el, err := weirWordcount(ctx, corpus, words)
			return float64(words) / el.Seconds(), err
		})
	if err != nil {
		return nil, err
	}
	l := compared("runtime-wordcount-2tm", "words_per_s", "runtime-wordcount-in-process", cluster, mini)
	l.Note = fmt.Sprintf("%d lines, %d words, 2 %s of 1 slot; %s", lines, words, where, l.Note)
	return []Line{l}, nil
}

// localJobManager is a job manager of JobTypes in this process, serving
// on a loopback port: the cluster benchmarks' (runtime-wordcount-2tm,
// recovery).
type localJobManager struct {
	srv  *jobmanager.Server
	addr string
	stop func() // stops serving and waits
}

// startJobManager starts a localJobManager; Close stops it.
func startJobManager(ctx context.Context) (*localJobManager, error) {
	reg, err := Registry()
	if err != nil {
		return nil, err
	}
	srv, err := jobmanager.New(jobmanager.Jobs(reg))
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		return nil, err
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, lis) }()
	return &localJobManager{srv: srv, addr: lis.Addr().String(), stop: func() { stop(); <-served }}, nil
}

// Close stops serving, then closes the job manager's stores.
func (j *localJobManager) Close() {
	j.stop()
	_ = j.srv.Close()
}

// waitSlots waits until the task managers offer n slots.
func waitSlots(ctx context.Context, srv *jobmanager.Server, n int) error {
	deadline := time.After(30 * time.Second)
	for {
		ch := srv.Changed()
		free := 0
		for _, tm := range srv.TaskManagers() {
			free += tm.Slots - tm.UsedSlots
		}
		if free >= n {
			return nil
		}
		select {
		case <-ch:
		case <-deadline:
			return fmt.Errorf("the task managers offer %d of %d slots after 30s", free, n)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// clusterWordcount submits the job and waits until it finished; it checks
// the words counted from the sinks' state in the final checkpoint.
func clusterWordcount(ctx context.Context, srv *jobmanager.Server, lines int, words int64) (time.Duration, error) {
	start := time.Now()
	id, err := srv.Submit(ctx, JobTypeWordcount, map[string]string{"lines": strconv.Itoa(lines)}, 100*time.Millisecond, "none")
	if err != nil {
		return 0, err
	}
	for {
		r, _, err := srv.Job(ctx, id)
		if err != nil {
			return 0, err
		}
		switch r.State {
		case jobmanager.StateFinished:
			el := time.Since(start)
			c, err := srv.LatestCheckpoint(ctx, id)
			if err != nil {
				return 0, err
			}
			if got := countedIn(c); got != words {
				return 0, errWrongCount{got, words}
			}
			return el, nil
		case jobmanager.StateFailed, jobmanager.StateCanceled:
			return 0, fmt.Errorf("bench job %s: %s %s", id, r.State, r.Error)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// countedIn sums the counts the sink subtasks snapshotted in c.
func countedIn(c checkpoint.Completed) int64 {
	var n int64
	for _, t := range c.Tasks {
		for _, op := range t.Operators {
			if op.UID != sinkUID {
				continue
			}
			for _, e := range op.State {
				if v, k := binary.Varint(e); k > 0 {
					n += v
				}
			}
		}
	}
	return n
}
