package jobmanager

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/runtime"
)

// Scheduling and remote deployment (docs/architecture.md, "Cluster").
//
// A job's attempt runs in slots: slot s holds subtask s of every vertex
// (runtime.SlotShares), so a job needs as many slots as its largest
// parallelism. The deployer spreads the slots over the task managers with
// free slots (round-robin, most free first), sends each task manager one
// DeployTasks with the tasks of its slots, and drives the shares as one
// runtime.Deployed (runtime.Combine): the job master (runtime's mini
// cluster loop: restore, checkpoint coordinator, restarts) runs in the job
// manager exactly as it does in one process.

// ErrTaskManagerLost is wrapped by the failure of an attempt that had tasks
// on a task manager whose session ended (killed, partitioned, silent).
var ErrTaskManagerLost = errors.New("task manager lost")

// ErrNotEnoughSlots is wrapped when a job needs more slots than the task
// managers offer.
var ErrNotEnoughSlots = errors.New("not enough slots")

// shareKey names one job attempt on one task manager.
type shareKey struct {
	job     string
	attempt int32
}

// share is one task manager's part of an attempt: a runtime.Deployed whose
// calls travel on the task manager's session.
type share struct {
	ss      *session
	key     shareKey
	tasks   []checkpoint.TaskID
	local   map[checkpoint.TaskID]bool
	rep     runtime.TaskReports
	log     *zap.Logger
	peers   map[string]string // every task of the attempt -> data address; set before Open
	anyTask checkpoint.TaskID

	prepMu   sync.Mutex
	prepared chan struct{} // closed on Prepared (or the session's end)
	prep     runtime.Prepared
	prepErr  error
	addr     string

	opened chan error // one Opened

	endOnce  sync.Once
	ended    chan struct{}
	finished bool
	// deployedAt is when the job manager deployed the tasks (their
	// start-time, Flink's DEPLOYING), endedAt when they ended (set
	// before ended is closed).
	deployedAt, endedAt time.Time

	completed checkpoint.Latest // newest checkpoint persisted (NoteCompleted), notified complete or restored

	statsMu sync.Mutex
	stats   map[checkpoint.TaskID]runtime.TaskStats // per task, as of the last heartbeat
	statsAt time.Time                               // when the last heartbeat's stats came
	// startedAt is when the job manager started the tasks (StartTasks;
	// zero before), firstSource how long after the task manager started
	// them a source task of the share first emitted a record (0: none
	// reported yet).
	startedAt   time.Time
	firstSource time.Duration
	// busy is each task's back-pressured share of the time between the
	// last two heartbeats (Flink's backPressuredTimeMsPerSecond / 1000).
	busy map[checkpoint.TaskID]float64
}

// Counts implements runtime.Deployed: the counts the task manager's last
// heartbeat reported for this share.
func (sh *share) Counts() runtime.RecordCounts {
	sh.statsMu.Lock()
	defer sh.statsMu.Unlock()
	stats := make([]runtime.TaskStats, 0, len(sh.stats))
	for _, st := range sh.stats {
		stats = append(stats, st)
	}
	return runtime.CountRecords(stats)
}

// setStats records the per-task counters of a heartbeat.
func (sh *share) setStats(tasks []*weirpb.TaskCounts) {
	if len(tasks) == 0 {
		return
	}
	m := make(map[checkpoint.TaskID]runtime.TaskStats, len(tasks))
	for _, t := range tasks {
		m[checkpoint.TaskID(t.TaskId)] = runtime.TaskStats{Task: checkpoint.TaskID(t.TaskId), RecordsIn: t.RecordsIn,
			RecordsOut: t.RecordsOut, BackPressured: time.Duration(t.BackPressuredMs) * time.Millisecond,
			Source: t.Source, Sink: t.Sink, PendingRecords: t.PendingRecords, RecordsLagMax: t.RecordsLagMax,
			InputWatermark: t.InputWatermark, OutputWatermark: t.OutputWatermark}
	}
	now := time.Now()
	sh.statsMu.Lock()
	defer sh.statsMu.Unlock()
	for _, t := range tasks {
		if f := time.Duration(t.FirstRecordUs) * time.Microsecond; t.Source && f > 0 && (sh.firstSource == 0 || f < sh.firstSource) {
			sh.firstSource = f
		}
	}
	if dt := now.Sub(sh.statsAt); !sh.statsAt.IsZero() && dt > 0 {
		busy := make(map[checkpoint.TaskID]float64, len(m))
		for id, st := range m {
			if prev, ok := sh.stats[id]; ok {
				busy[id] = min(1, max(0, float64(st.BackPressured-prev.BackPressured)/float64(dt)))
			}
		}
		sh.busy = busy
	}
	sh.stats, sh.statsAt = m, now
}

// taskFailure is a failure reported from a task manager: err (whose
// text it keeps) with where it happened, for the job's exception history,
// and when and how the job manager learned of it, for the recovery's
// timing (Recovery).
type taskFailure struct {
	task        checkpoint.TaskID // empty: the task manager's session ended
	taskManager string
	err         error
	at          time.Time
	detection   Detection
}

func (f *taskFailure) Error() string { return f.err.Error() }
func (f *taskFailure) Unwrap() error { return f.err }

// placedTask is one task of an attempt: where it runs and its counters.
type placedTask struct {
	taskManager string
	stats       runtime.TaskStats
	known       bool // stats came in a heartbeat
	// backPressured is the share of the time between the last two
	// heartbeats the task was back-pressured; bpKnown once two came.
	backPressured float64
	bpKnown       bool
	dataHost      string
	ended         bool
	finished      bool
	// started is when the task was deployed, endedAt when it ended (zero
	// while it runs).
	started, endedAt time.Time
}

// tasks returns every task of the attempt by id.
func (rd *remoteDeployment) tasks() map[checkpoint.TaskID]placedTask {
	out := map[checkpoint.TaskID]placedTask{}
	for _, sh := range rd.shares {
		sh.statsMu.Lock()
		stats, busy := sh.stats, sh.busy
		sh.statsMu.Unlock()
		ended, finished := false, false
		var endedAt time.Time
		select {
		case <-sh.ended:
			ended, finished, endedAt = true, sh.finished, sh.endedAt
		default:
		}
		for _, t := range sh.tasks {
			st, ok := stats[t]
			bp, bpKnown := busy[t]
			out[t] = placedTask{taskManager: sh.ss.tm.ID, dataHost: sh.ss.tm.DataHost, stats: st, known: ok, backPressured: bp,
				bpKnown: bpKnown, ended: ended, finished: finished, started: sh.deployedAt, endedAt: endedAt}
		}
	}
	return out
}

func (sh *share) send(m *weirpb.JobManagerMessage) error {
	select {
	case <-sh.ss.done:
		return sh.ss.err
	default:
	}
	return sh.ss.send(m)
}

func (sh *share) Prepared() runtime.Prepared { return sh.prep }

func (sh *share) Open(ctx context.Context, t checkpoint.Timing) error {
	err := sh.send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Open{Open: &weirpb.OpenTasks{
		JobId: sh.key.job, Attempt: sh.key.attempt, TaskAddresses: sh.peers,
		IntervalMs: t.Interval.Milliseconds(), TimeoutMs: t.Timeout.Milliseconds(), MinPauseMs: t.MinPause.Milliseconds(),
		TolerableFailures: int32(t.TolerableFailures), RestartBudgetMs: t.RestartBudget.Milliseconds(),
		DetectionMs: t.Failover.Detection.Milliseconds(), SlotWaitMs: t.Failover.SlotWait.Milliseconds(),
		RestartDelayMs: t.Failover.RestartDelay.Milliseconds(), RecoveryMs: t.Failover.Recovery.Milliseconds()}}})
	if err != nil {
		return err
	}
	select {
	case err := <-sh.opened:
		return err
	case <-sh.ended:
		return fmt.Errorf("tasks on %s ended before they opened", sh.ss.tm.ID)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (sh *share) Start(context.Context) error {
	return sh.send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Start{Start: &weirpb.StartTasks{
		JobId: sh.key.job, Attempt: sh.key.attempt}}})
}

func (sh *share) Trigger(_ context.Context, id checkpoint.ID, sources []checkpoint.TaskID, b runtime.Barrier) error {
	var mine []string
	for _, s := range sources {
		if sh.local[s] {
			mine = append(mine, string(s))
		}
	}
	if len(mine) == 0 {
		return nil
	}
	return sh.send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Trigger{Trigger: &weirpb.TriggerCheckpoint{
		JobId: sh.key.job, Attempt: sh.key.attempt, CheckpointId: uint64(id), SourceTaskIds: mine, Final: b.Final, Drain: b.Drain}}})
}

func (sh *share) Notify(_ context.Context, id checkpoint.ID, complete bool) {
	if complete {
		sh.completed.Note(id)
	}
	_ = sh.send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Notify{Notify: &weirpb.NotifyCheckpoint{
		JobId: sh.key.job, Attempt: sh.key.attempt, CheckpointId: uint64(id), Complete: complete}}})
}

// NoteCompleted records that the job master completed checkpoint id (it
// was persisted) before any notification: a cancel for good sent before the
// notification then carries it (runtime's completedNoter).
func (sh *share) NoteCompleted(id checkpoint.ID) { sh.completed.Note(id) }

func (sh *share) Cancel(forGood bool) {
	_ = sh.send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Cancel{Cancel: &weirpb.CancelTasks{
		JobId: sh.key.job, Attempt: sh.key.attempt, ForGood: forGood, LastCompleted: uint64(sh.completed.Load())}}})
}

// Wait waits for DeploymentEnded, or the end of the session: a task
// manager that is lost has no tasks any more.
func (sh *share) Wait() bool {
	<-sh.ended
	return sh.finished
}

// setPrepared records the answer to DeployTasks, once.
func (sh *share) setPrepared(p runtime.Prepared, addr string, err error) {
	sh.prepMu.Lock()
	defer sh.prepMu.Unlock()
	select {
	case <-sh.prepared:
		return
	default:
	}
	sh.prep, sh.addr, sh.prepErr = p, addr, err
	close(sh.prepared)
}

func (sh *share) end(finished bool) {
	sh.endOnce.Do(func() {
		sh.finished, sh.endedAt = finished, time.Now()
		close(sh.ended)
	})
}

// receive takes in one message of the task manager: a heartbeat at once, a
// chunk into asm, anything else into inbox (in order), a checkpoint ack
// whose snapshot is chunked once the snapshot arrived whole (or, if it
// cannot be assembled, as a decline saying why).
func (ss *session) receive(asm *rpc.Assembler, m *weirpb.TaskManagerMessage, inbox chan<- *weirpb.TaskManagerMessage) {
	switch v := m.Msg.(type) {
	case *weirpb.TaskManagerMessage_Heartbeat:
		ss.handle(m)
		return
	case *weirpb.TaskManagerMessage_Goodbye:
		reason := cmp.Or(v.Goodbye.Reason, "it said goodbye")
		ss.goodbye.Store(&reason)
		return
	case *weirpb.TaskManagerMessage_Chunk:
		if err := asm.Add(v.Chunk); err != nil {
			ss.log.Warn("chunk dropped", zap.String("task_manager", ss.tm.ID), zap.Error(err))
		}
		return
	case *weirpb.TaskManagerMessage_Ack:
		a := v.Ack
		if h := a.SnapshotChunked; h != nil {
			asm.Expect(h, func(p []byte, err error) {
				if err != nil {
					ss.log.Warn("checkpoint snapshot not received", zap.String("task_manager", ss.tm.ID),
						zap.String("task", a.TaskId), zap.Uint64("checkpoint", a.CheckpointId), zap.Error(err))
					inbox <- &weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Decline{Decline: &weirpb.CheckpointDecline{
						JobId: a.JobId, Attempt: a.Attempt, TaskId: a.TaskId, CheckpointId: a.CheckpointId,
						Reason: fmt.Sprintf("snapshot of %s from %s: %v", a.TaskId, ss.tm.ID, err)}}}
					return
				}
				a.Snapshot, a.SnapshotChunked = p, nil
				inbox <- m
			})
			return
		}
	}
	inbox <- m
}

// handle routes one message of the task manager to the share it concerns.
func (ss *session) handle(m *weirpb.TaskManagerMessage) {
	var job string
	var attempt int32
	switch v := m.Msg.(type) {
	case *weirpb.TaskManagerMessage_Prepared:
		job, attempt = v.Prepared.JobId, v.Prepared.Attempt
	case *weirpb.TaskManagerMessage_Opened:
		job, attempt = v.Opened.JobId, v.Opened.Attempt
	case *weirpb.TaskManagerMessage_Ended:
		job, attempt = v.Ended.JobId, v.Ended.Attempt
	case *weirpb.TaskManagerMessage_Ack:
		job, attempt = v.Ack.JobId, v.Ack.Attempt
	case *weirpb.TaskManagerMessage_Decline:
		job, attempt = v.Decline.JobId, v.Decline.Attempt
	case *weirpb.TaskManagerMessage_SourceEnded:
		job, attempt = v.SourceEnded.JobId, v.SourceEnded.Attempt
	case *weirpb.TaskManagerMessage_Failed:
		job, attempt = v.Failed.JobId, v.Failed.Attempt
	case *weirpb.TaskManagerMessage_RequestCheckpoint:
		job, attempt = v.RequestCheckpoint.JobId, v.RequestCheckpoint.Attempt
	case *weirpb.TaskManagerMessage_Heartbeat:
		ss.mu.Lock()
		defer ss.mu.Unlock()
		for _, c := range v.Heartbeat.Counts {
			if sh := ss.shares[shareKey{c.JobId, c.Attempt}]; sh != nil {
				sh.setStats(c.Tasks)
			}
		}
		return
	default:
		return
	}
	ss.mu.Lock()
	sh := ss.shares[shareKey{job, attempt}]
	ss.mu.Unlock()
	if sh == nil {
		return // an attempt that ended here already
	}
	sh.handle(m)
}

func (sh *share) handle(m *weirpb.TaskManagerMessage) {
	switch v := m.Msg.(type) {
	case *weirpb.TaskManagerMessage_Prepared:
		p := v.Prepared
		var err error
		if p.Error != "" {
			err = fmt.Errorf("task manager %s: %s", sh.ss.tm.ID, p.Error)
			if p.Unrecoverable {
				err = runtime.Unrecoverable(err)
			}
			err = &taskFailure{taskManager: sh.ss.tm.ID, err: err, at: time.Now(), detection: DetectedDeployFailure}
		}
		sh.setPrepared(runtime.Prepared{Discarding: p.Discarding, RestoreCommitters: int(p.RestoreCommitters)}, p.DataAddress, err)
		if err != nil {
			// The task manager built nothing and sends no DeploymentEnded.
			sh.end(false)
		}
	case *weirpb.TaskManagerMessage_Opened:
		var err error
		if v.Opened.Error != "" {
			err = fmt.Errorf("task manager %s: %s", sh.ss.tm.ID, v.Opened.Error)
		}
		select {
		case sh.opened <- err:
		default:
		}
	case *weirpb.TaskManagerMessage_Ended:
		sh.setStats(v.Ended.Tasks) // the final counts, before anyone reads them as such
		sh.end(v.Ended.Finished)
	case *weirpb.TaskManagerMessage_Ack:
		a := v.Ack
		var snap checkpoint.TaskSnapshot
		if err := json.Unmarshal(a.Snapshot, &snap); err != nil {
			sh.rep.Decline(checkpoint.TaskID(a.TaskId), checkpoint.ID(a.CheckpointId),
				fmt.Errorf("snapshot of %s from %s: %w", a.TaskId, sh.ss.tm.ID, err))
			return
		}
		sh.rep.Ack(checkpoint.TaskID(a.TaskId), checkpoint.ID(a.CheckpointId), snap,
			runtime.SnapshotTimes{Alignment: time.Duration(a.AlignmentNs), Sync: time.Duration(a.SyncNs), Async: time.Duration(a.AsyncNs)})
	case *weirpb.TaskManagerMessage_Decline:
		d := v.Decline
		sh.rep.Decline(checkpoint.TaskID(d.TaskId), checkpoint.ID(d.CheckpointId), errors.New(d.Reason))
	case *weirpb.TaskManagerMessage_SourceEnded:
		sh.rep.SourceEnded(checkpoint.TaskID(v.SourceEnded.TaskId))
	case *weirpb.TaskManagerMessage_Failed:
		f := v.Failed
		err := fmt.Errorf("task %s on %s: %s", f.TaskId, sh.ss.tm.ID, f.Error)
		if f.Unrecoverable {
			err = runtime.Unrecoverable(err)
		}
		sh.rep.Failed(checkpoint.TaskID(f.TaskId), &taskFailure{task: checkpoint.TaskID(f.TaskId), taskManager: sh.ss.tm.ID, err: err,
			at: time.Now(), detection: DetectedTaskFailure})
	case *weirpb.TaskManagerMessage_RequestCheckpoint:
		sh.rep.RequestCheckpoint(v.RequestCheckpoint.Reason)
	}
}

// end ends the session, as how detected it: every share on it fails its
// attempt.
func (ss *session) end(err error, how Detection) {
	ss.mu.Lock()
	select {
	case <-ss.done:
		ss.mu.Unlock()
		return
	default:
	}
	ss.err = err
	close(ss.done)
	at := time.Now()
	shares := make([]*share, 0, len(ss.shares))
	for _, sh := range ss.shares {
		shares = append(shares, sh)
	}
	ss.mu.Unlock()
	for _, sh := range shares {
		select {
		case <-sh.ended:
			continue
		default:
		}
		tf := &taskFailure{taskManager: ss.tm.ID, err: err, at: at, detection: how}
		sh.rep.Failed(sh.anyTask, tf)
		sh.setPrepared(runtime.Prepared{}, "", tf)
		sh.end(false)
	}
}

// deployer deploys one job's attempts into the cluster's slots.
type deployer struct {
	s       *Server
	rec     JobRecord
	job     *runtime.Job
	slots   [][]checkpoint.TaskID // tasks per slot
	log     *zap.Logger
	onStart func(*remoteDeployment) // each deployed attempt
	// onSlots is called when an attempt got its slots.
	onSlots func(attempt int, at time.Time)
}

func newDeployer(s *Server, rec JobRecord, job *runtime.Job, log *zap.Logger) (*deployer, error) {
	_, n, err := runtime.SlotShares(job, 1)
	if err != nil {
		return nil, err
	}
	slots, _, err := runtime.SlotShares(job, n)
	if err != nil {
		return nil, err
	}
	return &deployer{s: s, rec: rec, job: job, slots: slots, log: log}, nil
}

// Deploy implements runtime.Deployer.
func (d *deployer) Deploy(ctx context.Context, spec runtime.DeploySpec, rep runtime.TaskReports) (runtime.Deployed, error) {
	sessions, err := d.s.allocate(ctx, d.rec.ID, len(d.slots))
	if err != nil {
		return nil, err
	}
	if d.onSlots != nil {
		d.onSlots(spec.Attempt, time.Now())
	}
	// Group the slots by task manager: one share each.
	var order []*session
	byTM := map[*session][]checkpoint.TaskID{}
	for i, ss := range sessions {
		if _, ok := byTM[ss]; !ok {
			order = append(order, ss)
		}
		byTM[ss] = append(byTM[ss], d.slots[i]...)
	}
	release := func() { d.s.release(sessions) }
	var restore []byte
	if spec.Restore != nil {
		if restore, err = json.Marshal(spec.Restore); err != nil {
			release()
			return nil, runtime.Unrecoverable(fmt.Errorf("encode restore: %w", err))
		}
	}
	key := shareKey{d.rec.ID, int32(spec.Attempt)}
	// One secret per attempt binds the attempt's data-plane connections to
	// it: a stranger, or a task manager of another attempt, cannot prove
	// it (docs/architecture.md, "Data plane").
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		release()
		return nil, fmt.Errorf("data-plane secret: %w", err)
	}
	shares := make([]*share, 0, len(order))
	var sending sync.WaitGroup
	var placed []string
	for _, ss := range order {
		tasks := byTM[ss]
		sh := &share{ss: ss, key: key, tasks: tasks, local: map[checkpoint.TaskID]bool{}, rep: rep, log: d.log,
			anyTask: tasks[0], prepared: make(chan struct{}), opened: make(chan error, 1), ended: make(chan struct{}), deployedAt: time.Now()}
		sh.completed.Note(spec.LastCompleted)
		ids := make([]string, len(tasks))
		for i, t := range tasks {
			sh.local[t] = true
			ids[i] = string(t)
		}
		ss.mu.Lock()
		ss.shares[key] = sh
		select {
		case <-ss.done: // lost since it was allocated
			sh.setPrepared(runtime.Prepared{}, "", ss.err)
			sh.end(false)
		default:
		}
		ss.mu.Unlock()
		shares = append(shares, sh)
		placed = append(placed, fmt.Sprintf("%s:%d", ss.tm.ID, len(tasks)))
		// The task managers receive their deployments (restored state
		// in chunks) at the same time.
		sending.Add(1)
		go func() {
			defer sending.Done()
			sh.deploy(&weirpb.DeployTasks{
				JobId: d.rec.ID, JobType: d.rec.Type, Params: d.rec.Params, Attempt: key.attempt, TaskIds: ids,
				LastCompleted: uint64(spec.LastCompleted), RestartCause: spec.RestartCause,
				BatchSize: int32(spec.BatchSize), ChannelCapacity: int32(spec.ChannelCapacity), DataSecret: secret,
				CheckpointStorage: spec.StorageURL, StateInlineLimit: spec.InlineLimit}, restore)
		}()
	}
	sending.Wait()
	rd := &remoteDeployment{shares: shares, release: release, attempt: spec.Attempt}
	rd.Deployed = runtime.Combine(asDeployed(shares)...)
	var errs []error
	for _, sh := range shares {
		select {
		case <-sh.prepared:
			if sh.prepErr != nil {
				errs = append(errs, sh.prepErr)
			}
		case <-ctx.Done():
			// The cause: the failure that ended the attempt (a task
			// manager lost while it prepared), not a bare "context
			// canceled".
			errs = append(errs, context.Cause(ctx))
		}
	}
	if err := errors.Join(errs...); err != nil {
		rd.Cancel(false)
		rd.Wait()
		return nil, err
	}
	peers := map[string]string{}
	for _, sh := range shares {
		for _, t := range sh.tasks {
			peers[string(t)] = sh.addr
		}
	}
	for _, sh := range shares {
		sh.peers = peers
	}
	rd.stop = context.AfterFunc(ctx, func() { rd.Cancel(errors.Is(context.Cause(ctx), runtime.ErrJobCanceled)) })
	rd.deployedAt = time.Now()
	sort.Strings(placed)
	d.log.Info("attempt deployed", zap.Int("attempt", spec.Attempt), zap.Int("slots", len(d.slots)), zap.Strings("tasks_per_task_manager", placed))
	if d.onStart != nil {
		d.onStart(rd)
	}
	return rd, nil
}

// deploy sends dt with the restored state to the share's task manager, the
// state in chunks if it is large. A deployment that cannot be sent because
// it is too large fails the attempt for good: sending it again cannot
// succeed. Any other failure to send ends the session.
func (sh *share) deploy(dt *weirpb.DeployTasks, restore []byte) {
	ss := sh.ss
	msg := func() *weirpb.JobManagerMessage {
		return &weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Deploy{Deploy: dt}}
	}
	err := ss.chunker.Send(restore,
		func(p []byte) error { dt.Restore = p; return sh.send(msg()) },
		func(h *weirpb.Chunked) error { dt.RestoreChunked = h; return sh.send(msg()) },
		func(c *weirpb.Chunk) error {
			return sh.send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Chunk{Chunk: c}})
		})
	switch {
	case err == nil:
	case errors.Is(err, rpc.ErrMessageTooLarge):
		err = runtime.Unrecoverable(fmt.Errorf("deploy to %s: %w", ss.tm.ID, err))
		sh.log.Error("deployment not sent", zap.String("task_manager", ss.tm.ID), zap.Error(err))
		sh.setPrepared(runtime.Prepared{}, "", err)
		sh.end(false)
	default:
		ss.end(fmt.Errorf("%w: %s: deploy: %w", ErrTaskManagerLost, ss.tm.ID, err), DetectedConnectionLoss)
	}
}

func asDeployed(shares []*share) []runtime.Deployed {
	out := make([]runtime.Deployed, len(shares))
	for i, sh := range shares {
		out[i] = sh
	}
	return out
}

// remoteDeployment is an attempt's shares; Wait frees their slots.
type remoteDeployment struct {
	runtime.Deployed
	shares  []*share
	release func()
	stop    func() bool
	attempt int

	// deployedAt is when every task manager had prepared its share,
	// openedAt when every task had opened (zero: not yet).
	timesMu              sync.Mutex
	deployedAt, openedAt time.Time
}

// Open opens every share (runtime.Deployed) and notes when they all had.
func (rd *remoteDeployment) Open(ctx context.Context, t checkpoint.Timing) error {
	err := rd.Deployed.Open(ctx, t)
	if err == nil {
		rd.timesMu.Lock()
		rd.openedAt = time.Now()
		rd.timesMu.Unlock()
	}
	return err
}

// Start starts every share (runtime.Deployed), noting when in each.
func (rd *remoteDeployment) Start(ctx context.Context) error {
	now := time.Now()
	for _, sh := range rd.shares {
		sh.statsMu.Lock()
		sh.startedAt = now
		sh.statsMu.Unlock()
	}
	return rd.Deployed.Start(ctx)
}

// times returns when the attempt was deployed and opened, and when its
// first source record came (as the task managers' heartbeats reported
// it); zero for what did not happen (yet).
func (rd *remoteDeployment) times() (deployed, opened, firstRecord time.Time) {
	rd.timesMu.Lock()
	deployed, opened = rd.deployedAt, rd.openedAt
	rd.timesMu.Unlock()
	for _, sh := range rd.shares {
		sh.statsMu.Lock()
		if sh.firstSource > 0 && !sh.startedAt.IsZero() {
			if at := sh.startedAt.Add(sh.firstSource); firstRecord.IsZero() || at.Before(firstRecord) {
				firstRecord = at
			}
		}
		sh.statsMu.Unlock()
	}
	return deployed, opened, firstRecord
}

// NoteCompleted passes a completed checkpoint on to every share (see
// share.NoteCompleted), through runtime.Combine's deployment.
func (rd *remoteDeployment) NoteCompleted(id checkpoint.ID) {
	if n, ok := rd.Deployed.(interface{ NoteCompleted(checkpoint.ID) }); ok {
		n.NoteCompleted(id)
	}
}

func (rd *remoteDeployment) Wait() bool {
	finished := rd.Deployed.Wait()
	if rd.stop != nil {
		rd.stop()
	}
	for _, sh := range rd.shares {
		sh.ss.mu.Lock()
		if sh.ss.shares[sh.key] == sh {
			delete(sh.ss.shares, sh.key)
		}
		sh.ss.mu.Unlock()
	}
	rd.release()
	return finished
}

// allocate takes n slots for job, waiting up to the slot timeout for task
// managers to offer them; slot i runs on the session it returns at i.
func (s *Server) allocate(ctx context.Context, job string, n int) ([]*session, error) {
	timeout := time.NewTimer(s.cfg.slotTimeout)
	defer timeout.Stop()
	for waiting := false; ; waiting = true {
		s.mu.Lock()
		got, free, total := s.takeLocked(n)
		changed := s.changed
		s.mu.Unlock()
		if got != nil {
			s.setWaiting(job, "")
			return got, nil
		}
		s.setWaiting(job, slotWait(n, free))
		if !waiting {
			s.cfg.log.Info("waiting for task manager slots", zap.String("job_id", job), zap.Int("slots", n),
				zap.Int("free", free), zap.Int("total", total), zap.Duration("timeout", s.cfg.slotTimeout))
		}
		select {
		case <-changed:
		case <-ctx.Done():
			s.setWaiting(job, "")
			return nil, ctx.Err()
		case <-timeout.C:
			s.setWaiting(job, "")
			return nil, fmt.Errorf("%w: job %s needs %d slots; the task managers have %d free of %d after waiting %v",
				ErrNotEnoughSlots, job, n, free, total, s.cfg.slotTimeout)
		}
	}
}

// slotWait is why a job that needs n slots while free are free waits.
func slotWait(n, free int) string {
	unit := "slots"
	if n == 1 {
		unit = "slot"
	}
	return fmt.Sprintf("waiting for %d %s, %d free", n, unit, free)
}

// setWaiting records why job id waits ("" once it no longer does), for its
// status.
func (s *Server) setWaiting(id, reason string) {
	s.jobs.mu.Lock()
	rj := s.jobs.running[id]
	s.jobs.mu.Unlock()
	if rj == nil {
		return
	}
	rj.mu.Lock()
	rj.waiting = reason
	rj.mu.Unlock()
}

// takeLocked takes n free slots, spread round-robin over the task managers
// with most free slots first; nil if there are fewer.
func (s *Server) takeLocked(n int) (got []*session, free, total int) {
	var live []*session
	for _, ss := range s.tms {
		total += ss.tm.Slots
		if f := ss.tm.Slots - ss.tm.UsedSlots; f > 0 {
			free += f
			live = append(live, ss)
		}
	}
	if free < n {
		return nil, free, total
	}
	sort.Slice(live, func(i, j int) bool {
		fi, fj := live[i].tm.Slots-live[i].tm.UsedSlots, live[j].tm.Slots-live[j].tm.UsedSlots
		if fi != fj {
			return fi > fj
		}
		return live[i].tm.ID < live[j].tm.ID
	})
	for len(got) < n {
		for _, ss := range live {
			if len(got) < n && ss.tm.UsedSlots < ss.tm.Slots {
				ss.tm.UsedSlots++
				got = append(got, ss)
			}
		}
	}
	return got, free, total
}

func (s *Server) release(sessions []*session) {
	s.mu.Lock()
	for _, ss := range sessions {
		ss.tm.UsedSlots--
	}
	s.notifyLocked()
	s.mu.Unlock()
}
