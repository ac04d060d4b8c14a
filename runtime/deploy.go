package runtime

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
)

// An attempt's tasks, wherever they run (docs/architecture.md, "Cluster").
//
// The job master side of an attempt (restore, checkpoint coordinator,
// restarts: MiniCluster.Run) talks to its tasks only through Deployed. In
// one process that is a local deployment of every task. In a cluster, the
// job manager's Deployer fans the same calls out to task managers, and each
// task manager runs a local deployment of its share of the tasks (Deploy),
// exchanging records with the other task managers through an Exchange.

// TaskReports receives what the tasks of a deployment report: the job
// master's attempt implements it, a task manager forwards every call to its
// job manager. Calls come from task goroutines and must not block for long.
type TaskReports interface {
	// Ack acknowledges checkpoint id with the task's snapshot and how long
	// the task's part of the checkpoint took.
	Ack(task checkpoint.TaskID, id checkpoint.ID, snap checkpoint.TaskSnapshot, times SnapshotTimes)
	// Decline declines checkpoint id.
	Decline(task checkpoint.TaskID, id checkpoint.ID, err error)
	// SourceEnded reports that a source task read all its input.
	SourceEnded(task checkpoint.TaskID)
	// Failed reports a task failure; the attempt fails.
	Failed(task checkpoint.TaskID, err error)
	// RequestCheckpoint asks for a checkpoint now (an operator's
	// OperatorContext.RequestCheckpoint).
	RequestCheckpoint(reason string)
}

// Prepared is what a deployment reports once its tasks are built and the
// restored transactions are committed, before any task opens.
type Prepared struct {
	// Discarding names the operators that are checkpoint listeners but not
	// checkpoint.AbortCarrier: with any of them the job tolerates no
	// failed checkpoint.
	Discarding []string
	// RestoreCommitters counts the operators of subtask 0 that can commit
	// restored transactions (RestoreCommitter).
	RestoreCommitters int
}

// Deployed is an attempt's tasks after Deploy: prepared, not yet open.
type Deployed interface {
	// Prepared describes the deployed tasks.
	Prepared() Prepared
	// Open restores and opens every task, with the checkpoint timing the
	// job runs under. It returns once every task is open (nil), or when ctx
	// is done; a task that fails to open is reported (TaskReports.Failed)
	// before Open returns.
	Open(ctx context.Context, timing checkpoint.Timing) error
	// Start lets the sources read. Call it only after every deployment of
	// the attempt opened.
	Start(ctx context.Context) error
	// Trigger injects barrier id at the given source tasks (those this
	// deployment runs), as b says.
	Trigger(ctx context.Context, id checkpoint.ID, sources []checkpoint.TaskID, b Barrier) error
	// Notify tells every task that checkpoint id completed or was aborted.
	Notify(ctx context.Context, id checkpoint.ID, complete bool)
	// Cancel stops every task. forGood: the job is cancelled, not
	// restarted (checkpoint.CancelListener operators are told).
	Cancel(forGood bool)
	// Wait blocks until every task ended (closing the operators of tasks
	// that never opened), and reports whether every task finished its
	// stream.
	Wait() (finished bool)
	// Counts reports the records the deployment's sources emitted and its
	// sinks wrote so far in this attempt (a source's count is published
	// after each Poll).
	Counts() RecordCounts
}

// RecordCounts are the records that entered a job (emitted by its
// sources) and left it (written by its sinks), in one attempt.
type RecordCounts struct {
	In, Out int64
}

// Exchange carries records between the tasks of a deployment and tasks of
// the same attempt in other processes, on numbered channels (one per
// upstream subtask, downstream subtask and edge; both ends number them
// alike from the job graph). Every message of a channel arrives once, in
// order; the Exchange's buffers are bounded, so a slow receiver blocks Send.
type Exchange interface {
	// Send sends msg on channel ch to task to (in another process). It
	// must not keep msg once it returns: the caller reuses it.
	Send(ctx context.Context, to checkpoint.TaskID, ch uint32, msg []byte) error
	// Recv returns the next message of channel ch.
	Recv(ctx context.Context, ch uint32) ([]byte, error)
}

// InputDeclarer is an Exchange that accepts messages only on the channels
// a deployment declared (a task manager's data plane: anything else is a
// stranger's). Deploy calls DeclareInputs once, before the first Recv, with
// every channel it will receive on and the remote task sending on each.
type InputDeclarer interface {
	DeclareInputs(from map[uint32]checkpoint.TaskID)
}

// DeploySpec says which tasks of which attempt a deployment runs, and what
// they restore.
type DeploySpec struct {
	// JobID is the job's id (OperatorContext.Job; transactional ids derive
	// from it).
	JobID string
	// Attempt counts the job's attempts from 0.
	Attempt int
	// Tasks are the tasks to run here; nil runs every task of the job.
	Tasks []checkpoint.TaskID
	// Restore is the state every task restores (AssignState); nil: none.
	Restore *StateAssignment
	// LastCompleted is the job's latest completed checkpoint.
	LastCompleted checkpoint.ID
	// RestartCause is the failure that led to this attempt.
	RestartCause string
	// BatchSize and ChannelCapacity are as the ClusterOpts of those names
	// (0: their defaults).
	BatchSize, ChannelCapacity int
	// Logger logs (nil: none); Failpoints injects faults (nil: none).
	Logger     *zap.Logger
	Failpoints Failpointer
	// Storage, when set, is the checkpoint storage the tasks write their
	// state to (acknowledging with references) and read referenced state
	// back from on restore; nil keeps state inline in the
	// acknowledgements. StorageURL names it, for a job manager to pass it
	// to task managers, which open it themselves.
	Storage    storage.Storage
	StorageURL string
	// InlineLimit is the snapshot size below which a task's state stays
	// inline even with Storage (0: checkpoint.DefaultInlineLimit,
	// negative: none).
	InlineLimit int64
	// FullUploads makes every checkpoint write every key group again
	// rather than reusing the references of unchanged ones (no
	// incremental checkpoints).
	FullUploads bool
	// StateMemory is the task manager's memory and directory for jobs on
	// the pebble state backend (nil: such a job fails to start here).
	StateMemory *StateMemory
}

// ErrRemoteEdge is wrapped by Deploy's error when records of a type that
// cannot be encoded would have to cross a process boundary.
var ErrRemoteEdge = errors.New("records cannot cross processes")

// Deploy builds the tasks spec names from job, connects them with each other
// in process and with the attempt's other tasks through ex (nil when every
// task runs here), and commits the restored transactions their subtask-0
// operators must commit. The deployment reports to rep. ctx bounds the
// deployment's life: cancelling it stops the tasks as Cancel(false) does.
func Deploy(ctx context.Context, job *Job, spec DeploySpec, ex Exchange, rep TaskReports) (Deployed, error) {
	p, err := compile(job)
	if err != nil {
		return nil, err
	}
	return deploy(ctx, p, spec, ex, rep)
}

// errAttemptCanceled is the cause with which a deployment's tasks are
// cancelled by Cancel(false): the attempt ends, the job restarts.
var errAttemptCanceled = errors.New("attempt cancelled")

// localDeployment is the tasks of one attempt that run in this process.
type localDeployment struct {
	spec    DeploySpec
	p       *plan
	rep     TaskReports
	log     *zap.Logger
	ctx     context.Context
	cancel  context.CancelCauseFunc
	tasks   []*task
	byID    map[checkpoint.TaskID]*task
	ocs     []*OperatorContext
	restore [][]*SubtaskState
	pumps   sync.WaitGroup
	prep    Prepared

	metrics metricRegistry

	state *stateWriter // nil: state inline

	lastDone checkpoint.Latest
	opened   bool
	start    chan struct{}
	wg       sync.WaitGroup
	finished atomic.Int32
}

func deploy(parent context.Context, p *plan, spec DeploySpec, ex Exchange, rep TaskReports) (*localDeployment, error) {
	if spec.BatchSize == 0 {
		spec.BatchSize = defaultBatchSize
	}
	if spec.ChannelCapacity == 0 {
		spec.ChannelCapacity = defaultChannelCap
	}
	if spec.Logger == nil {
		spec.Logger = zap.NewNop()
	}
	if spec.Restore == nil {
		spec.Restore = &StateAssignment{Subtasks: map[OperatorSubtask]*SubtaskState{}}
	}
	ctx, cancel := context.WithCancelCause(parent)
	d := &localDeployment{spec: spec, p: p, rep: rep, log: spec.Logger, ctx: ctx, cancel: cancel,
		byID: map[checkpoint.TaskID]*task{}, start: make(chan struct{})}
	d.lastDone.Note(spec.LastCompleted)
	local := func(checkpoint.TaskID) bool { return true }
	if spec.Tasks != nil {
		set := map[checkpoint.TaskID]bool{}
		for _, id := range spec.Tasks {
			set[id] = true
		}
		local = func(id checkpoint.TaskID) bool { return set[id] }
	}
	restore, bases, err := resolveRestore(ctx, p, spec, local)
	if err != nil {
		cancel(errAttemptCanceled)
		return nil, err
	}
	d.spec.Restore = restore
	d.state = newStateWriter(spec, spec.Logger)
	for id, b := range bases {
		d.state.seed(id, b)
	}
	if err := d.build(local, ex); err != nil {
		d.fail()
		return nil, err
	}
	if err := d.commitRestored(); err != nil {
		d.fail()
		return nil, err
	}
	return d, nil
}

// fail ends a deployment that never opened.
func (d *localDeployment) fail() {
	d.cancel(errAttemptCanceled)
	d.closeAll()
	d.pumps.Wait()
	d.state.wait()
}

// channelIDs numbers channel (edge e, upstream subtask i, downstream subtask
// j) alike in every process: edges in plan order, then i, then j.
func channelIDs(p *plan) map[*edge]uint32 {
	base := map[*edge]uint32{}
	var n uint32
	for _, v := range p.vertices {
		for _, e := range v.inputs {
			base[e] = n
			n += uint32(p.byNode[e.from].parallelism * v.parallelism)
		}
	}
	return base
}

// build creates the local tasks and their channels: in process between two
// local tasks, through the Exchange to and from remote ones.
func (d *localDeployment) build(local func(checkpoint.TaskID) bool, ex Exchange) error {
	bases := channelIDs(d.p)
	// The receive pumps start once the Exchange knows every input channel.
	inputs := map[uint32]checkpoint.TaskID{}
	var recvPumps []func()
	// chans[edge][from subtask][to subtask]
	chans := map[*edge][][]chan envelope{}
	for _, v := range d.p.vertices {
		for _, e := range v.inputs {
			from := d.p.byNode[e.from]
			m := make([][]chan envelope, from.parallelism)
			for i := range m {
				m[i] = make([]chan envelope, v.parallelism)
				for j := range m[i] {
					if e.kind == edgeForward && i != j {
						continue
					}
					src, dst := from.taskID(i), v.taskID(j)
					if !local(src) && !local(dst) {
						continue
					}
					ch := make(chan envelope, d.spec.ChannelCapacity)
					m[i][j] = ch
					if local(src) && local(dst) {
						continue
					}
					if ex == nil {
						return fmt.Errorf("task %s runs elsewhere and the deployment has no exchange", dst)
					}
					if e.codecErr != nil {
						return fmt.Errorf("%w: %s -> %s: %w", ErrRemoteEdge, e.from.name, e.to.name, e.codecErr)
					}
					id := bases[e] + uint32(i*v.parallelism+j)
					if local(src) {
						d.pumps.Add(1)
						go d.sendPump(ex, e, src, dst, id, ch)
					} else {
						inputs[id] = src
						recvPumps = append(recvPumps, func() { d.recvPump(ex, e, dst, id, ch) })
					}
				}
			}
			chans[e] = m
		}
	}
	if dx, ok := ex.(InputDeclarer); ok && len(inputs) > 0 {
		dx.DeclareInputs(inputs)
	}
	for _, run := range recvPumps {
		d.pumps.Add(1)
		go run()
	}
	tw := &taskWiring{ctx: d.ctx, batchSize: d.spec.BatchSize, maxPar: d.p.job.maxParallelism}
	restore := d.spec.Restore
	// The keyed operator subtasks of each slot here (slot s holds subtask
	// s of every vertex): they split the slot's state memory.
	keyedIn := map[int]int{}
	for _, v := range d.p.vertices {
		for sub := 0; sub < v.parallelism; sub++ {
			if local(v.taskID(sub)) {
				for _, n := range v.nodes {
					if n.keyed {
						keyedIn[sub]++
					}
				}
			}
		}
	}
	for _, v := range d.p.vertices {
		for sub := 0; sub < v.parallelism; sub++ {
			if !local(v.taskID(sub)) {
				continue
			}
			t := &task{id: v.taskID(sub), v: v, subtask: sub, ctrl: make(chan control, 1024), rep: d, log: d.log,
				stats: newTaskStats(), now: &recordTime{ts: NoTimestamp}}
			if v.nodes[0].kind == kindSource {
				t.interrupt = make(chan struct{}, 1) // only a source's Poll waits on it
			}
			ttw := *tw
			ttw.stats, ttw.now = t.stats, t.now
			// Output writers of the tail.
			var pushes []any
			sidePushes := map[string][]any{}
			for _, e := range v.outputs {
				var targets []chan envelope
				if e.kind == edgeForward {
					targets = []chan envelope{chans[e][sub][sub]}
				} else {
					targets = chans[e][sub]
				}
				push, gate := e.newWriter(&ttw, targets, sub)
				if e.tag != "" {
					sidePushes[e.tag] = append(sidePushes[e.tag], push)
				} else {
					pushes = append(pushes, push)
				}
				t.outs = append(t.outs, gate)
			}
			var out any
			tail := v.nodes[len(v.nodes)-1]
			sides := map[string]any{}
			for tag, ps := range sidePushes {
				sides[tag] = tail.sides[tag].fanout(ps)
			}
			switch {
			case tail.kind == kindSink:
			case len(pushes) == 0:
				out = tail.discard()
			case len(pushes) == 1:
				out = pushes[0]
			default:
				out = tail.fanout(pushes)
			}
			// Operators, tail first, each pushing into the next.
			t.ops = make([]instance, len(v.nodes))
			rs := make([]*SubtaskState, len(v.nodes))
			for i := len(v.nodes) - 1; i >= 0; i-- {
				n := v.nodes[i]
				oc := &OperatorContext{Job: d.spec.JobID, Name: n.name, UID: n.uid, Subtask: sub,
					Parallelism: n.parallelism, Attempt: d.spec.Attempt, Logger: d.log.With(zap.String("operator", n.name), zap.Int("subtask", sub)),
					Failpoints: d.spec.Failpoints, RequestCheckpoint: d.rep.RequestCheckpoint, RestartCause: d.spec.RestartCause,
					metrics: &operatorMetrics{reg: &d.metrics, operator: n.name, subtask: sub}, now: t.now,
					stateBackend: d.p.job.stateBackend, stateMem: d.spec.StateMemory, stateShare: keyedIn[sub], stateStorage: d.spec.Storage}
				if n == tail {
					oc.sides = sides
				}
				if r := restore.Subtasks[OperatorSubtask{n.uid, sub}]; r != nil {
					rs[i] = r
					oc.RestoredFrom, oc.Restored = r.From, r.Entries
					oc.CommitHandles, oc.AbortHandles = r.CommitHandles, r.AbortHandles
				}
				if sub == 0 {
					oc.OrphanHandles = restore.Orphans
				}
				d.ocs = append(d.ocs, oc)
				// A source's emitted records are its task's records in, a
				// sink's written ones its task's records out.
				switch n.kind {
				case kindSource:
					oc.records, oc.firstRecord, oc.interrupt = &t.stats.in, &t.stats.firstIn, t.interrupt
				case kindSink:
					oc.records = &t.stats.out
				}
				inst, err := n.newInstance(oc, out)
				if err != nil {
					return fmt.Errorf("operator %q: %w", n.name, err)
				}
				t.ops[i] = inst
				if p, ok := inst.(recordPublisher); ok {
					t.publishers = append(t.publishers, p)
				}
				out = inst.input()
			}
			// A keyed head takes the key groups a hash edge's writer computed.
			var keyed any
			if kh, ok := t.ops[0].(interface{ inputWithKeyGroup() any }); ok {
				keyed = kh.inputWithKeyGroup()
			}
			for _, e := range v.inputs {
				from := d.p.byNode[e.from]
				head, headKG := out, keyed
				if e.adapt != nil {
					head, headKG = e.adapt(out, keyed)
				}
				var deliver func(batcher) (int, error)
				if e.kind == edgeHash {
					deliver = e.bind(head, headKG, t.now)
				} else {
					deliver = e.bind(head, nil, t.now)
				}
				for i := 0; i < from.parallelism; i++ {
					if ch := chans[e][i][sub]; ch != nil {
						t.inputs = append(t.inputs, inputChan{ch: ch, deliver: deliver})
					}
				}
			}
			d.tasks = append(d.tasks, t)
			d.byID[t.id] = t
			d.restore = append(d.restore, rs)
		}
	}
	d.prep.Discarding = discardingOperators(d.tasks)
	return nil
}

// Envelope kinds on an Exchange channel: the first byte of a message.
const (
	msgBatch   byte = 1 // records without timestamps
	msgBarrier byte = 2
	msgEOS     byte = 3
	msgBatchTS byte = 4 // records, each after its timestamp (a varint)
	msgMark    byte = 5 // a watermark (kind, varint) or a status (kind)
)

// sendPump forwards what the local task from writes on ch to the remote
// task to, encoding every message into one reused buffer.
func (d *localDeployment) sendPump(ex Exchange, e *edge, from, to checkpoint.TaskID, id uint32, ch <-chan envelope) {
	defer d.pumps.Done()
	buf := make([]byte, 0, 1024)
	for {
		var env envelope
		select {
		case env = <-ch:
		case <-d.ctx.Done():
			return
		}
		switch {
		case env.batch != nil:
			var err error
			if buf, err = encodeBatch(e, buf[:0], env.batch); err != nil {
				d.rep.Failed(from, fmt.Errorf("send %s -> %s: %w", e.from.name, e.to.name, err))
				return
			}
			env.batch.release() // encoded: the writer may refill it
		case env.barrier != 0:
			buf = binary.AppendUvarint(append(buf[:0], msgBarrier), uint64(env.barrier))
		case env.eos:
			buf = append(buf[:0], msgEOS)
		case env.mark != 0:
			buf = append(buf[:0], msgMark, byte(env.mark))
			if env.mark == markWatermark {
				buf = binary.AppendVarint(buf, env.wm)
			}
		}
		if err := ex.Send(d.ctx, to, id, buf); err != nil {
			if d.ctx.Err() == nil {
				d.rep.Failed(from, fmt.Errorf("send to %s: %w", to, err))
			}
			return
		}
		if env.eos {
			return
		}
	}
}

// encodeBatch appends a batch message to dst; a codec's panic is an error.
func encodeBatch(e *edge, dst []byte, b batcher) (msg []byte, err error) {
	defer recoverInto(&err)
	return e.encode(dst, b), nil
}

// recvPump forwards what a remote task sends on channel id to ch, the input
// of the local task to.
func (d *localDeployment) recvPump(ex Exchange, e *edge, to checkpoint.TaskID, id uint32, ch chan<- envelope) {
	defer d.pumps.Done()
	for {
		msg, err := ex.Recv(d.ctx, id)
		if err != nil {
			if d.ctx.Err() == nil {
				d.rep.Failed(to, fmt.Errorf("receive %s -> %s: %w", e.from.name, e.to.name, err))
			}
			return
		}
		env, err := decodeEnvelope(e, msg)
		if err != nil {
			d.rep.Failed(to, fmt.Errorf("receive %s -> %s: %w", e.from.name, e.to.name, err))
			return
		}
		select {
		case ch <- env:
		case <-d.ctx.Done():
			return
		}
		if env.eos {
			return
		}
	}
}

// decodeEnvelope decodes one message of an Exchange channel; a codec's
// panic is an error (recoverInto, as in encodeBatch), so a bad record fails
// the receiving task, never the process.
func decodeEnvelope(e *edge, msg []byte) (_ envelope, err error) {
	defer recoverInto(&err)
	if len(msg) == 0 {
		return envelope{}, fmt.Errorf("%w: empty message", ErrDecode)
	}
	switch msg[0] {
	case msgBatch, msgBatchTS:
		b, err := e.decode(msg[0], msg[1:])
		return envelope{batch: b}, err
	case msgBarrier:
		id, n := binary.Uvarint(msg[1:])
		if n <= 0 || id == 0 {
			return envelope{}, fmt.Errorf("%w: barrier", ErrDecode)
		}
		return envelope{barrier: checkpoint.ID(id)}, nil
	case msgEOS:
		return envelope{eos: true}, nil
	case msgMark:
		if len(msg) < 2 {
			return envelope{}, fmt.Errorf("%w: mark", ErrDecode)
		}
		switch k := markKind(msg[1]); k {
		case markIdle, markActive:
			return envelope{mark: k}, nil
		case markWatermark:
			wm, n := binary.Varint(msg[2:])
			if n <= 0 {
				return envelope{}, fmt.Errorf("%w: watermark", ErrDecode)
			}
			return envelope{mark: k, wm: wm}, nil
		}
		return envelope{}, fmt.Errorf("%w: mark kind %d", ErrDecode, msg[1])
	}
	return envelope{}, fmt.Errorf("%w: message kind %d", ErrDecode, msg[0])
}

// discardingOperators names the operators of tasks that are checkpoint
// listeners but not checkpoint.AbortCarrier.
func discardingOperators(tasks []*task) []string {
	var out []string
	seen := map[string]bool{}
	for _, t := range tasks {
		for i, op := range t.ops {
			u := op.user()
			if _, ok := u.(checkpoint.Listener); !ok {
				continue
			}
			if _, ok := u.(checkpoint.AbortCarrier); ok {
				continue
			}
			if n := t.v.nodes[i].name; !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	sort.Strings(out)
	return out
}

// commitRestored runs CommitRestored on the local subtask 0 of every
// operator with transactions to commit, all at once, and waits for every
// one.
func (d *localDeployment) commitRestored() error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for _, t := range d.tasks {
		if t.subtask != 0 {
			continue
		}
		for i, op := range t.ops {
			rc, ok := op.(restoreCommitter)
			if !ok || !rc.hasRestoreCommitter() {
				continue
			}
			d.prep.RestoreCommitters++
			if !rc.mustCommitRestored() {
				continue
			}
			wg.Add(1)
			go func(name string) {
				defer wg.Done()
				if err := rc.commitRestored(d.ctx); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("task %s: commit restored transactions of %s: %w", t.id, name, err))
					mu.Unlock()
				}
			}(t.v.nodes[i].name)
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// closeAll closes every operator of tasks that never ran.
func (d *localDeployment) closeAll() {
	for _, t := range d.tasks {
		if err := t.closeOps(); err != nil {
			d.log.Warn("closing an operator of a task that never ran", zap.String("task", string(t.id)), zap.Error(err))
		}
	}
}

func (d *localDeployment) Prepared() Prepared { return d.prep }

func (d *localDeployment) Counts() RecordCounts { return CountRecords(d.TaskStats()) }

func (d *localDeployment) Open(ctx context.Context, timing checkpoint.Timing) error {
	for _, oc := range d.ocs {
		oc.Checkpointing = timing
	}
	d.opened = true
	var ready sync.WaitGroup
	ready.Add(len(d.tasks))
	for i, t := range d.tasks {
		d.wg.Add(1)
		go func(t *task, r []*SubtaskState) {
			defer d.wg.Done()
			var once sync.Once
			err := t.run(d.ctx, r, func() { once.Do(ready.Done) }, d.start)
			if err != nil {
				// Report the failure before counting this task ready: a
				// task that failed to open (or restore) must keep the
				// sources from ever starting.
				d.rep.Failed(t.id, err)
			}
			once.Do(ready.Done)
			if err == nil {
				d.finished.Add(1)
			}
		}(t, d.restore[i])
	}
	allReady := make(chan struct{})
	go func() {
		ready.Wait()
		close(allReady)
	}()
	select {
	case <-allReady:
		return d.ctx.Err()
	case <-ctx.Done():
		return ctx.Err()
	case <-d.ctx.Done():
		return d.ctx.Err()
	}
}

// end ends every task of a deployment that never opened (task.end), all at
// once, with the checkpoint timing the job runs under, and returns their
// errors joined: the ending step of a job cancelled while no attempt ran.
func (d *localDeployment) end(ctx context.Context, timing checkpoint.Timing) error {
	for _, oc := range d.ocs {
		oc.Checkpointing = timing
	}
	errs := make([]error, len(d.tasks))
	var wg sync.WaitGroup
	for i, t := range d.tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = t.end(ctx, d.restore[i])
		}()
	}
	wg.Wait()
	d.cancel(ErrJobCanceled)
	d.pumps.Wait()
	d.state.wait()
	return errors.Join(errs...)
}

func (d *localDeployment) Start(context.Context) error {
	if err := d.ctx.Err(); err != nil {
		return err
	}
	close(d.start)
	return nil
}

// Barrier says how a trigger's barrier is injected at the sources.
type Barrier struct {
	// Final marks a trigger after every source ended: once it completes,
	// the sources end their streams.
	Final bool
	// Drain marks a stop-with-savepoint with drain: each source stops
	// reading (no Poll after it) and emits MaxWatermark, so every
	// event-time window and timer downstream fires, before the barrier.
	Drain bool
}

func (d *localDeployment) Trigger(ctx context.Context, id checkpoint.ID, sources []checkpoint.TaskID, b Barrier) error {
	for _, s := range sources {
		t := d.byID[s]
		if t == nil {
			continue
		}
		if err := d.send(ctx, t, control{kind: ctrlTrigger, id: id, final: b.Final, drain: b.Drain}); err != nil {
			return err
		}
	}
	return nil
}

func (d *localDeployment) Notify(ctx context.Context, id checkpoint.ID, complete bool) {
	kind := ctrlAbort
	if complete {
		kind = ctrlComplete
		d.lastDone.Note(id)
	}
	if d.state != nil {
		d.state.notify(id, complete)
	}
	for _, t := range d.tasks {
		_ = d.send(ctx, t, control{kind: kind, id: id})
	}
}

func (d *localDeployment) send(ctx context.Context, t *task, c control) error {
	select {
	case t.ctrl <- c:
		select {
		case t.interrupt <- struct{}{}:
		default:
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-d.ctx.Done():
		return d.ctx.Err()
	}
}

// completedNoter is a Deployed that can be told that the job master
// completed a checkpoint without notifying its tasks (NoteCompleted): a
// cancel for good then commits what that checkpoint covers. Every Deployed
// of this package is one; a job manager's deployments are too.
type completedNoter interface {
	NoteCompleted(id checkpoint.ID)
}

// NoteCompleted records that the job master completed checkpoint id, as a
// Notify would, without notifying the tasks: a cancel for good that may
// overtake the notification (a task manager handles a cancel ahead of its
// queued commands) then commits what id covers (NotifyJobCanceled).
func (d *localDeployment) NoteCompleted(id checkpoint.ID) { d.lastDone.Note(id) }

func (d *localDeployment) Cancel(forGood bool) {
	if forGood {
		d.cancel(ErrJobCanceled)
	} else {
		d.cancel(errAttemptCanceled)
	}
}

func (d *localDeployment) Wait() bool {
	if !d.opened {
		d.fail()
		return false
	}
	d.wg.Wait()
	finished := int(d.finished.Load()) == len(d.tasks)
	// Pumps end with their channel's end of stream, or when the
	// deployment is cancelled. After every task finished, a send pump
	// may still be forwarding the end of its stream: let it.
	if !finished {
		d.cancel(errAttemptCanceled)
	}
	d.pumps.Wait()
	d.state.wait()
	d.cancel(errAttemptCanceled)
	return finished
}

// The reporter the local tasks use.

func (d *localDeployment) ack(task checkpoint.TaskID, id checkpoint.ID, snap checkpoint.TaskSnapshot, t snapshotTiming) {
	if d.state == nil {
		if encodeSnapshot(d, task, id, snap) {
			d.rep.Ack(task, id, snap, t.times())
		}
		return
	}
	d.state.write(d.ctx, task, id, snap,
		func(out checkpoint.TaskSnapshot) { d.rep.Ack(task, id, out, t.times()) },
		func(err error) {
			// A codec's panic while the state was encoded for the upload
			// fails the task, as in the task's asynchronous part.
			var pe *panicError
			if errors.As(err, &pe) {
				d.rep.Failed(task, fmt.Errorf("task %s: async snapshot for checkpoint %d: %w", task, id, err))
				return
			}
			d.rep.Decline(task, id, err)
		})
}

func (d *localDeployment) decline(task checkpoint.TaskID, id checkpoint.ID, err error) {
	d.rep.Decline(task, id, err)
}

func (d *localDeployment) sourceEnded(task checkpoint.TaskID) { d.rep.SourceEnded(task) }

func (d *localDeployment) failed(task checkpoint.TaskID, err error) { d.rep.Failed(task, err) }

func (d *localDeployment) lastCompleted() checkpoint.ID { return d.lastDone.Load() }

// TaskIDs lists every task of job (sources first in plan order), and its
// source tasks: what a job manager schedules.
func TaskIDs(job *Job) (tasks, sources []checkpoint.TaskID, err error) {
	p, err := compile(job)
	if err != nil {
		return nil, nil, err
	}
	tasks, sources = p.taskIDs()
	return tasks, sources, nil
}

func (p *plan) taskIDs() (tasks, sources []checkpoint.TaskID) {
	for _, v := range p.vertices {
		for sub := 0; sub < v.parallelism; sub++ {
			tasks = append(tasks, v.taskID(sub))
			if v.isSource() {
				sources = append(sources, v.taskID(sub))
			}
		}
	}
	return tasks, sources
}

// SlotShares deals the tasks of job over n shares (a job manager's task
// managers) by Flink's default slot sharing: slot s holds subtask s of every
// vertex, so the job needs as many slots as its largest parallelism
// (slots), and slot s goes to share s % n.
func SlotShares(job *Job, n int) (shares [][]checkpoint.TaskID, slots int, err error) {
	if n < 1 {
		return nil, 0, fmt.Errorf("%w: %d shares", ErrInvalidOption, n)
	}
	p, err := compile(job)
	if err != nil {
		return nil, 0, err
	}
	shares = make([][]checkpoint.TaskID, n)
	for _, v := range p.vertices {
		slots = max(slots, v.parallelism)
		for sub := 0; sub < v.parallelism; sub++ {
			shares[sub%n] = append(shares[sub%n], v.taskID(sub))
		}
	}
	return shares, slots, nil
}

// Combine returns one Deployed made of parts, each a share of one
// attempt's tasks (a job manager combines the deployments of its task
// managers this way).
func Combine(parts ...Deployed) Deployed { return combined(parts) }

type combined []Deployed

func (c combined) Prepared() Prepared {
	var p Prepared
	seen := map[string]bool{}
	for _, d := range c {
		dp := d.Prepared()
		p.RestoreCommitters += dp.RestoreCommitters
		for _, n := range dp.Discarding {
			if !seen[n] {
				seen[n] = true
				p.Discarding = append(p.Discarding, n)
			}
		}
	}
	sort.Strings(p.Discarding)
	return p
}

// each runs fn on every part at once and joins the errors.
func (c combined) each(fn func(Deployed) error) error {
	errs := make([]error, len(c))
	var wg sync.WaitGroup
	for i, d := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(d)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (c combined) Open(ctx context.Context, timing checkpoint.Timing) error {
	return c.each(func(d Deployed) error { return d.Open(ctx, timing) })
}

func (c combined) Start(ctx context.Context) error {
	return c.each(func(d Deployed) error { return d.Start(ctx) })
}

func (c combined) Trigger(ctx context.Context, id checkpoint.ID, sources []checkpoint.TaskID, b Barrier) error {
	return c.each(func(d Deployed) error { return d.Trigger(ctx, id, sources, b) })
}

func (c combined) Notify(ctx context.Context, id checkpoint.ID, complete bool) {
	_ = c.each(func(d Deployed) error { d.Notify(ctx, id, complete); return nil })
}

func (c combined) Counts() RecordCounts {
	var sum RecordCounts
	for _, d := range c {
		n := d.Counts()
		sum.In, sum.Out = sum.In+n.In, sum.Out+n.Out
	}
	return sum
}

// NoteCompleted implements completedNoter on every part that does.
func (c combined) NoteCompleted(id checkpoint.ID) {
	for _, d := range c {
		if n, ok := d.(completedNoter); ok {
			n.NoteCompleted(id)
		}
	}
}

func (c combined) Cancel(forGood bool) {
	for _, d := range c {
		d.Cancel(forGood)
	}
}

func (c combined) Wait() bool {
	var unfinished atomic.Bool
	_ = c.each(func(d Deployed) error {
		if !d.Wait() {
			unfinished.Store(true)
		}
		return nil
	})
	return !unfinished.Load()
}
