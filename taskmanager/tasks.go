package taskmanager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/runtime"
)

// The deployments a session runs (docs/architecture.md, "Cluster"): each
// DeployTasks of the job manager becomes a runtime.Deployed of this task
// manager's share of one attempt, with an Exchange of its own; the job
// manager's later messages for that job and attempt drive it, and what its
// tasks report goes back on the session. A lost session cancels every
// deployment it started.

// depKey names one job attempt.
type depKey struct {
	job     string
	attempt int32
}

// deployments are a session's running deployments.
type deployments struct {
	ctx  context.Context
	c    *cfg
	send func(*weirpb.TaskManagerMessage) error
	// chunker splits the large payloads sent on the session (snapshots).
	chunker *rpc.Chunker

	mu   sync.Mutex
	deps map[depKey]*deployment
	wg   sync.WaitGroup
}

func newDeployments(ctx context.Context, c *cfg, send func(*weirpb.TaskManagerMessage) error) *deployments {
	return &deployments{ctx: ctx, c: c, send: send, chunker: rpc.NewChunker(rpc.DefaultChunkSize), deps: map[depKey]*deployment{}}
}

// stop waits for every deployment to end; the session's context, which
// bounds their life, is done.
func (ds *deployments) stop() { ds.wg.Wait() }

// deployment is one share of one attempt on this task manager.
type deployment struct {
	key  depKey
	ds   *deployments
	cmds commands // Open, Start, Trigger, Notify, in order

	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	canceled bool // CancelTasks arrived
	forGood  bool
	dep      runtime.Deployed

	started atomic.Int64 // when StartTasks arrived (Unix nanoseconds; 0: not yet)
}

// receive takes in one message of the job manager: a chunk into asm, a
// deployment whose restored state is chunked once the state arrived whole
// (or, if it cannot be assembled, answered with a failed Prepared saying
// why), anything else at once.
func (ds *deployments) receive(asm *rpc.Assembler, m *weirpb.JobManagerMessage) {
	switch v := m.Msg.(type) {
	case *weirpb.JobManagerMessage_Chunk:
		if err := asm.Add(v.Chunk); err != nil {
			ds.c.log.Warn("chunk dropped", zap.Error(err))
		}
		return
	case *weirpb.JobManagerMessage_Deploy:
		dt := v.Deploy
		if h := dt.RestoreChunked; h != nil {
			asm.Expect(h, func(p []byte, err error) {
				if err != nil {
					err = fmt.Errorf("restored state: %w", err)
					ds.c.log.Warn("deploying tasks failed", zap.String("job", dt.JobId), zap.Int32("attempt", dt.Attempt), zap.Error(err))
					if err := ds.send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Prepared{Prepared: &weirpb.Prepared{
						JobId: dt.JobId, Attempt: dt.Attempt, Error: err.Error()}}}); err != nil {
						ds.c.log.Debug("report not sent: session lost", zap.Error(err))
					}
					return
				}
				dt.Restore, dt.RestoreChunked = p, nil
				ds.handle(m)
			})
			return
		}
	}
	ds.handle(m)
}

// handle dispatches one message of the job manager.
func (ds *deployments) handle(m *weirpb.JobManagerMessage) {
	switch msg := m.Msg.(type) {
	case *weirpb.JobManagerMessage_Deploy:
		ds.deploy(msg.Deploy)
	case *weirpb.JobManagerMessage_Cancel:
		if d := ds.get(msg.Cancel.JobId, msg.Cancel.Attempt); d != nil {
			d.cancelTasks(msg.Cancel.ForGood, checkpoint.ID(msg.Cancel.LastCompleted))
		}
	case *weirpb.JobManagerMessage_Open:
		ds.enqueue(msg.Open.JobId, msg.Open.Attempt, m)
	case *weirpb.JobManagerMessage_Start:
		ds.enqueue(msg.Start.JobId, msg.Start.Attempt, m)
	case *weirpb.JobManagerMessage_Trigger:
		ds.enqueue(msg.Trigger.JobId, msg.Trigger.Attempt, m)
	case *weirpb.JobManagerMessage_Notify:
		ds.enqueue(msg.Notify.JobId, msg.Notify.Attempt, m)
	}
}

// counts are the record counts of the deployments built so far, and of
// their tasks, for a heartbeat.
func (ds *deployments) counts() []*weirpb.DeploymentCounts {
	var out []*weirpb.DeploymentCounts
	for _, b := range ds.built() {
		out = append(out, &weirpb.DeploymentCounts{JobId: b.key.job, Attempt: b.key.attempt, Tasks: taskCounts(b.dep, b.d.startedAt())})
	}
	return out
}

// taskCounts are the counters of dep's tasks, as the job manager reads
// them, with how long after started each source task had its first record
// (none with started zero).
func taskCounts(dep runtime.Deployed, started time.Time) []*weirpb.TaskCounts {
	sr, ok := dep.(statsReader)
	if !ok {
		return nil
	}
	var out []*weirpb.TaskCounts
	for _, t := range sr.TaskStats() {
		var first time.Duration
		if !t.FirstRecord.IsZero() && !started.IsZero() {
			first = max(t.FirstRecord.Sub(started), time.Microsecond)
		}
		out = append(out, &weirpb.TaskCounts{TaskId: string(t.Task), RecordsIn: t.RecordsIn,
			RecordsOut: t.RecordsOut, BackPressuredMs: t.BackPressured.Milliseconds(), Source: t.Source, Sink: t.Sink,
			PendingRecords: t.PendingRecords, RecordsLagMax: t.RecordsLagMax, InputWatermark: t.InputWatermark, OutputWatermark: t.OutputWatermark,
			FirstRecordUs: first.Microseconds()})
	}
	return out
}

// builtDeployment is a deployment whose tasks were built.
type builtDeployment struct {
	key depKey
	dep runtime.Deployed
	d   *deployment
}

// built lists the deployments whose tasks were built, by job and attempt.
func (ds *deployments) built() []builtDeployment {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	var out []builtDeployment
	for k, d := range ds.deps {
		d.mu.Lock()
		dep := d.dep
		d.mu.Unlock()
		if dep != nil {
			out = append(out, builtDeployment{k, dep, d})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].key.job != out[j].key.job {
			return out[i].key.job < out[j].key.job
		}
		return out[i].key.attempt < out[j].key.attempt
	})
	return out
}

func (ds *deployments) get(job string, attempt int32) *deployment {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return ds.deps[depKey{job, attempt}]
}

// enqueue hands m to its deployment's command loop without waiting; a
// message for a deployment that ended is dropped (the job manager learns of
// the end from DeploymentEnded).
func (ds *deployments) enqueue(job string, attempt int32, m *weirpb.JobManagerMessage) {
	if d := ds.get(job, attempt); d != nil {
		d.cmds.push(m)
	}
}

// commands is a deployment's queue of the job manager's commands. It is
// unbounded, so that the session's receive loop never waits for a
// deployment busy with a command (an Open restoring state, a Trigger held
// by a back-pressured source): a receive loop that waits leaves heartbeats
// unread and the session drops, cancelling every deployment. The job
// manager sends a few commands per checkpoint; the queue goes with its
// deployment.
type commands struct {
	mu    sync.Mutex
	queue []*weirpb.JobManagerMessage
	ready chan struct{} // holds a token while queue is not empty
}

func newCommands() commands { return commands{ready: make(chan struct{}, 1)} }

func (c *commands) push(m *weirpb.JobManagerMessage) {
	c.mu.Lock()
	c.queue = append(c.queue, m)
	c.mu.Unlock()
	select {
	case c.ready <- struct{}{}:
	default:
	}
}

// pop returns the oldest command, nil if none is queued.
func (c *commands) pop() *weirpb.JobManagerMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		return nil
	}
	m := c.queue[0]
	c.queue[0] = nil
	c.queue = c.queue[1:]
	return m
}

// deploy builds the share DeployTasks names and answers Prepared; the
// deployment then runs on its own goroutine until it ends.
func (ds *deployments) deploy(m *weirpb.DeployTasks) {
	key := depKey{m.JobId, m.Attempt}
	ctx, cancel := context.WithCancel(ds.ctx)
	d := &deployment{key: key, ds: ds, cmds: newCommands(), ctx: ctx, cancel: cancel}
	ds.mu.Lock()
	if ds.deps[key] != nil {
		ds.mu.Unlock()
		cancel()
		ds.c.log.Warn("job manager deployed an attempt twice; ignored", zap.String("job", m.JobId), zap.Int32("attempt", m.Attempt))
		return
	}
	ds.deps[key] = d
	ds.mu.Unlock()
	ds.wg.Add(1)
	go func() {
		defer ds.wg.Done()
		defer func() {
			ds.mu.Lock()
			delete(ds.deps, key)
			ds.mu.Unlock()
			cancel()
		}()
		d.run(m)
	}()
}

// completedNoter is a deployment that can be told a checkpoint completed
// without a notification (runtime.Deploy's deployments are).
type completedNoter interface {
	NoteCompleted(id checkpoint.ID)
}

// cancelTasks cancels the deployment at once, ahead of the commands still
// queued for it: the job manager's Notify of checkpoint lastCompleted may
// be among them, so the deployment is told of it first, and a cancel for
// good commits what that checkpoint covers (NotifyJobCanceled), as the
// sinks of the other task managers, notified already, did.
func (d *deployment) cancelTasks(forGood bool, lastCompleted checkpoint.ID) {
	d.mu.Lock()
	d.canceled, d.forGood = true, d.forGood || forGood
	dep := d.dep
	d.mu.Unlock()
	if dep != nil {
		if n, ok := dep.(completedNoter); ok {
			n.NoteCompleted(lastCompleted)
		}
		dep.Cancel(forGood) // first: the cause decides NotifyJobCanceled
	}
	d.cancel()
}

func (d *deployment) log() *zap.Logger {
	return d.ds.c.log.With(zap.String("job", d.key.job), zap.Int32("attempt", d.key.attempt))
}

// run builds, reports Prepared, executes the job manager's commands in
// order and reports DeploymentEnded.
func (d *deployment) run(m *weirpb.DeployTasks) {
	dep, x, err := d.build(m)
	prep := &weirpb.Prepared{JobId: d.key.job, Attempt: d.key.attempt}
	if err != nil {
		prep.Error, prep.Unrecoverable = err.Error(), runtime.IsUnrecoverable(err)
		d.log().Warn("deploying tasks failed", zap.Error(err))
		d.reply(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Prepared{Prepared: prep}})
		return
	}
	p := dep.Prepared()
	prep.DataAddress, prep.Discarding, prep.RestoreCommitters = x.Addr(), p.Discarding, int32(p.RestoreCommitters)
	d.mu.Lock()
	d.dep = dep
	canceled, forGood := d.canceled, d.forGood
	d.mu.Unlock()
	if canceled {
		dep.Cancel(forGood)
	}
	d.reply(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Prepared{Prepared: prep}})
	d.log().Info("tasks deployed", zap.Strings("tasks", m.TaskIds), zap.String("data_address", x.Addr()))

	opened := false
	ended := make(chan bool, 1)
	wait := func() { ended <- dep.Wait() }
	execute := func(c *weirpb.JobManagerMessage) {
		switch msg := c.Msg.(type) {
		case *weirpb.JobManagerMessage_Open:
			if opened {
				return
			}
			opened = true
			peers := map[checkpoint.TaskID]string{}
			for t, a := range msg.Open.TaskAddresses {
				peers[checkpoint.TaskID(t)] = a
			}
			x.SetPeers(peers)
			o := msg.Open
			err := dep.Open(d.ctx, checkpoint.Timing{Interval: ms(o.IntervalMs), Timeout: ms(o.TimeoutMs),
				MinPause: ms(o.MinPauseMs), TolerableFailures: int(o.TolerableFailures), RestartBudget: ms(o.RestartBudgetMs),
				Failover: checkpoint.Failover{Detection: ms(o.DetectionMs), SlotWait: ms(o.SlotWaitMs),
					RestartDelay: ms(o.RestartDelayMs), Recovery: ms(o.RecoveryMs)}})
			op := &weirpb.Opened{JobId: d.key.job, Attempt: d.key.attempt}
			if err != nil {
				op.Error = err.Error()
			}
			d.reply(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Opened{Opened: op}})
			go wait()
		case *weirpb.JobManagerMessage_Start:
			d.started.Store(time.Now().UnixNano())
			if err := dep.Start(d.ctx); err != nil {
				d.log().Info("start after the tasks stopped", zap.Error(err))
				break
			}
		case *weirpb.JobManagerMessage_Trigger:
			t := msg.Trigger
			srcs := make([]checkpoint.TaskID, len(t.SourceTaskIds))
			for i, s := range t.SourceTaskIds {
				srcs[i] = checkpoint.TaskID(s)
			}
			if err := dep.Trigger(d.ctx, checkpoint.ID(t.CheckpointId), srcs, runtime.Barrier{Final: t.Final, Drain: t.Drain}); err != nil {
				d.log().Info("trigger after the tasks stopped", zap.Uint64("checkpoint", t.CheckpointId), zap.Error(err))
			}
		case *weirpb.JobManagerMessage_Notify:
			dep.Notify(d.ctx, checkpoint.ID(msg.Notify.CheckpointId), msg.Notify.Complete)
		}
	}
	for {
		select {
		case <-d.cmds.ready:
			// Stop at a cancel: the commands left go with the deployment.
			for c := d.cmds.pop(); c != nil && d.ctx.Err() == nil; c = d.cmds.pop() {
				execute(c)
			}
		case finished := <-ended:
			d.end(dep, finished)
			return
		case <-d.ctx.Done():
			// The session is lost or the job manager cancelled the tasks
			// before they opened.
			dep.Cancel(d.forGoodNow())
			if !opened {
				go wait()
			}
			d.end(dep, <-ended)
			return
		}
	}
}

func (d *deployment) forGoodNow() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.forGood
}

// end tells the job manager dep's tasks ended, with their final counters
// (what they counted after the last heartbeat included).
func (d *deployment) end(dep runtime.Deployed, finished bool) {
	d.log().Info("tasks ended", zap.Bool("finished", finished))
	d.reply(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Ended{Ended: &weirpb.DeploymentEnded{JobId: d.key.job, Attempt: d.key.attempt,
		Finished: finished, Tasks: taskCounts(dep, d.startedAt())}}})
}

// startedAt is when StartTasks arrived (zero: not yet).
func (d *deployment) startedAt() time.Time {
	if ns := d.started.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// build builds the job from the registry and deploys this share of it.
func (d *deployment) build(m *weirpb.DeployTasks) (runtime.Deployed, *Exchange, error) {
	c := d.ds.c
	job, err := c.jobs.Build(m.JobType, m.Params)
	if err != nil {
		return nil, nil, err
	}
	restore := &runtime.StateAssignment{}
	if len(m.Restore) > 0 {
		if err := json.Unmarshal(m.Restore, restore); err != nil {
			// The job manager sends the same bytes on every restart.
			return nil, nil, runtime.Unrecoverable(fmt.Errorf("restored state: %w", err))
		}
	} else {
		restore = nil
	}
	tasks := make([]checkpoint.TaskID, len(m.TaskIds))
	for i, t := range m.TaskIds {
		tasks[i] = checkpoint.TaskID(t)
	}
	if len(tasks) == 0 {
		return nil, nil, errors.New("a deployment without tasks")
	}
	x, err := ListenExchange(d.ctx, c.dataHost, c.window, AttemptID{Job: m.JobId, Attempt: m.Attempt}, m.DataSecret,
		append([]DataOpt{DataLogger(d.log()), DataRejections(c.dataRejects)}, c.dataOpts...)...)
	if err != nil {
		return nil, nil, err
	}
	spec := runtime.DeploySpec{JobID: m.JobId, Attempt: int(m.Attempt), Tasks: tasks, Restore: restore,
		LastCompleted: checkpoint.ID(m.LastCompleted), RestartCause: m.RestartCause,
		BatchSize: int(m.BatchSize), ChannelCapacity: int(m.ChannelCapacity),
		Logger: c.log.With(zap.String("job", m.JobId)), Failpoints: c.fp, InlineLimit: m.StateInlineLimit,
		StateMemory: c.stateMem}
	if u := m.CheckpointStorage; u != "" {
		if c.storageURL != "" {
			u = c.storageURL
		}
		st, err := c.storages.open(d.ctx, u)
		if err != nil {
			return nil, nil, fmt.Errorf("checkpoint storage: %w", err)
		}
		spec.Storage, spec.StorageURL = st, u
	}
	dep, err := Deploy(d.ctx, job, spec, x, &reporter{d: d})
	if err != nil {
		return nil, nil, err
	}
	return dep, x, nil
}

func (d *deployment) reply(m *weirpb.TaskManagerMessage) {
	if err := d.ds.send(m); errors.Is(err, rpc.ErrMessageTooLarge) {
		d.log().Error("report not sent", zap.Error(err))
	} else if err != nil {
		// The session is lost: it cancels every deployment.
		d.log().Debug("report not sent: session lost", zap.Error(err))
	}
}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

// reporter sends what the deployment's tasks report to the job manager.
type reporter struct{ d *deployment }

// Ack sends the ack with the snapshot, the snapshot in chunks if it is
// large; an ack that cannot be sent because it is too large is a decline
// saying so.
func (r *reporter) Ack(task checkpoint.TaskID, id checkpoint.ID, snap checkpoint.TaskSnapshot, times runtime.SnapshotTimes) {
	b, err := json.Marshal(snap)
	if err != nil {
		r.Decline(task, id, fmt.Errorf("encode snapshot: %w", err))
		return
	}
	ds := r.d.ds
	ack := &weirpb.CheckpointAck{JobId: r.d.key.job, Attempt: r.d.key.attempt, TaskId: string(task), CheckpointId: uint64(id),
		AlignmentNs: int64(times.Alignment), SyncNs: int64(times.Sync), AsyncNs: int64(times.Async)}
	msg := func() *weirpb.TaskManagerMessage {
		return &weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Ack{Ack: ack}}
	}
	err = ds.chunker.Send(b,
		func(p []byte) error { ack.Snapshot = p; return ds.send(msg()) },
		func(h *weirpb.Chunked) error { ack.SnapshotChunked = h; return ds.send(msg()) },
		func(c *weirpb.Chunk) error {
			return ds.send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Chunk{Chunk: c}})
		})
	switch {
	case err == nil:
	case errors.Is(err, rpc.ErrMessageTooLarge):
		r.d.log().Error("checkpoint ack not sent", zap.String("task", string(task)), zap.Uint64("checkpoint", uint64(id)), zap.Error(err))
		r.Decline(task, id, fmt.Errorf("ack: %w", err))
	default:
		r.d.log().Debug("report not sent: session lost", zap.Error(err))
	}
}

func (r *reporter) Decline(task checkpoint.TaskID, id checkpoint.ID, err error) {
	r.d.reply(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Decline{Decline: &weirpb.CheckpointDecline{JobId: r.d.key.job, Attempt: r.d.key.attempt,
		TaskId: string(task), CheckpointId: uint64(id), Reason: err.Error()}}})
}

func (r *reporter) SourceEnded(task checkpoint.TaskID) {
	r.d.reply(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_SourceEnded{SourceEnded: &weirpb.SourceEnded{JobId: r.d.key.job, Attempt: r.d.key.attempt,
		TaskId: string(task)}}})
}

func (r *reporter) Failed(task checkpoint.TaskID, err error) {
	r.d.reply(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Failed{Failed: &weirpb.TaskFailed{JobId: r.d.key.job, Attempt: r.d.key.attempt,
		TaskId: string(task), Error: err.Error(), Unrecoverable: runtime.IsUnrecoverable(err)}}})
}

func (r *reporter) RequestCheckpoint(reason string) {
	r.d.reply(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_RequestCheckpoint{RequestCheckpoint: &weirpb.CheckpointRequest{JobId: r.d.key.job,
		Attempt: r.d.key.attempt, Reason: reason}}})
}
