package runtime

import (
	"context"
	"fmt"
	"strings"

	"github.com/weirstream/weir/checkpoint"
)

type nodeKind int

const (
	kindOperator nodeKind = iota
	kindSource
	kindSink
)

type edgeKind int

const (
	edgeForward edgeKind = iota
	edgeHash
	edgeRebalance
	edgeBroadcast
)

func (k edgeKind) String() string {
	return [...]string{"forward", "hash", "rebalance", "broadcast"}[k]
}

// pushFn hands one record to the next operator.
type pushFn[T any] func(T) error

// node is one operator of the job graph, with its types erased behind
// closures built by the typed API functions.
type node struct {
	id          int
	name, uid   string
	parallelism int
	kind        nodeKind
	keyed       bool
	// broadcastState: the operator state is broadcast state, one full
	// copy per subtask (OperatorLayout.BroadcastState).
	broadcastState bool
	inputs         []*edge
	outputs        []*edge
	// newInstance creates the operator of one subtask; out is the typed
	// pushFn of its output (nil for sinks).
	newInstance func(oc *OperatorContext, out any) (instance, error)
	// newUser creates a source's or sink's user operator alone (nil for
	// other operators), for checks outside any task (VerifyRestore).
	newUser func() any
	// union: the source's or sink's operator state is union list state
	// (it implements UnionState), recorded when the graph is built so
	// that restoring never constructs user code to learn it.
	union   bool
	fanout  func(pushes []any) any
	discard func() any
	// collect makes the node's output push (a pushFn of its type) that
	// hands every record to fn untyped (an OperatorHarness's output).
	collect func(fn func(any) error) any
	// watermarks is a source's WatermarkStrategy[T] (Watermarks), nil if none.
	watermarks any
	// sides are the node's side outputs read by SideOutput, by tag id.
	sides map[string]*sideOutput
	// stateReader opens a keyed operator's function to read its state
	// (ReadKeyedState); nil for operators without keyed state.
	stateReader func(ctx context.Context) (keyedStateReader, error)
	// broadcastReader opens a broadcast operator's function to read its
	// broadcast state (ReadBroadcastState); nil for other operators.
	broadcastReader func(ctx context.Context) (*BroadcastRegistry, error)
}

// edge connects two operators. Its closures carry the record type.
type edge struct {
	from, to *node
	kind     edgeKind
	tag      string // the side output it carries ("": the main output)
	keyGroup any    // func(T) int for hash edges
	// newWriter creates the typed output writer of one upstream subtask.
	newWriter func(tw *taskWiring, chans []chan envelope, subtask int) (any, outputGate)
	// bind returns the delivery of the edge's batches (*batch[T]) into the
	// downstream head: its pushFn[T], or keyed (a func(T, int) error taking
	// the key group, nil if the head has none) for a batch that carries key
	// groups. Delivery returns how many records it pushed, and releases the
	// batch once it pushed them all. Before it pushes a record it sets now
	// to the record's timestamp.
	bind func(head, keyed any, now *recordTime) func(batcher) (int, error)
	// codecErr is why records of the edge's type cannot cross a process
	// boundary (CheckDefaultCodec), nil if they can; encode and decode
	// carry a batch (*batch[T]) across one with DefaultCodec: encode
	// appends a message (its kind byte, msgBatch or msgBatchTS, first),
	// decode reads the body of one of that kind.
	codecErr error
	encode   func(dst []byte, b batcher) []byte
	decode   func(kind byte, b []byte) (batcher, error)
	// adapt, on an input of a node with several inputs (Connect), turns
	// the head's input (its pushFn, and its keyed push or nil) into pushes
	// of the edge's record type that tag each record with its input; nil:
	// the edge carries the head's own type.
	adapt func(head, keyed any) (any, any)
}

// instance is one operator of one subtask, types erased.
type instance interface {
	// input is the operator's pushFn[In] (nil for sources).
	input() any
	// snapshot takes the synchronous part of the operator's snapshot at a
	// barrier; the returned function, if any, finishes it asynchronously.
	snapshot(ctx context.Context, id checkpoint.ID) (checkpoint.OperatorSnapshot, func() (map[int][]byte, error), error)
	restore(snap *SubtaskState) error
	open(ctx context.Context) error
	notify(ctx context.Context, id checkpoint.ID, complete bool) error
	close() error
	// user is the user's object (source, sink, process function), nil for
	// built-in stateless operators.
	user() any
}

// recordPublisher is an instance that counts its records in a plain field
// (a source what it emitted, a sink what it wrote): its task publishes the
// count to the task's stats after each poll and each batch it delivered,
// one atomic operation per batch rather than per record (as outWriter does
// for records out).
type recordPublisher interface{ publishRecords() }

// vertex is a chain of operators that run in one task per subtask.
type vertex struct {
	id          int
	nodes       []*node // head first
	parallelism int
	inputs      []*edge // network edges into the head
	outputs     []*edge // network edges out of the tail
}

func (v *vertex) name() string {
	names := make([]string, len(v.nodes))
	for i, n := range v.nodes {
		names[i] = n.name
	}
	return strings.Join(names, " -> ")
}

func (v *vertex) isSource() bool { return v.nodes[0].kind == kindSource }

func (v *vertex) isSink() bool { return v.nodes[len(v.nodes)-1].kind == kindSink }

// taskID names subtask i of the vertex, stable for a graph and parallelism.
func (v *vertex) taskID(i int) checkpoint.TaskID {
	return checkpoint.TaskID(fmt.Sprintf("%s#%d", v.nodes[0].uid, i))
}

// plan is a compiled job graph: vertices in topological order.
type plan struct {
	job      *Job
	vertices []*vertex
	byNode   map[*node]*vertex
}

// chainable reports whether e is a forward edge inside one chain.
func chainable(e *edge) bool {
	return e.kind == edgeForward && e.tag == "" && len(e.from.outputs) == 1 && len(e.to.inputs) == 1 &&
		e.from.parallelism == e.to.parallelism
}

// compile validates the graph and chains forward edges into vertices.
func compile(j *Job) (*plan, error) {
	if j.err != nil {
		return nil, j.err
	}
	if j.maxParallelism < 1 || j.maxParallelism > 1<<15 {
		return nil, fmt.Errorf("%w: max parallelism %d out of [1, 32768]", ErrInvalidJob, j.maxParallelism)
	}
	if _, err := ParseStateBackend(string(j.stateBackend)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidJob, err)
	}
	uids := map[string]string{}
	var sources int
	for _, n := range j.nodes {
		if other, dup := uids[n.uid]; dup {
			return nil, fmt.Errorf("%w: operators %q and %q share uid %q", ErrInvalidJob, other, n.name, n.uid)
		}
		uids[n.uid] = n.name
		if n.kind == kindSource {
			sources++
		}
		if n.keyed && n.parallelism > j.maxParallelism {
			return nil, fmt.Errorf("%w: keyed operator %q: parallelism %d exceeds max parallelism %d",
				ErrInvalidJob, n.name, n.parallelism, j.maxParallelism)
		}
		if n.kind != kindSource && len(n.inputs) == 0 {
			return nil, fmt.Errorf("%w: operator %q has no input", ErrInvalidJob, n.name)
		}
	}
	if sources == 0 {
		return nil, fmt.Errorf("%w: job %q has no source", ErrInvalidJob, j.name)
	}
	p := &plan{job: j, byNode: map[*node]*vertex{}}
	// Nodes are created in topological order (an operator only connects
	// to streams that exist), so one pass builds the chains.
	for _, n := range j.nodes {
		if len(n.inputs) == 1 && chainable(n.inputs[0]) {
			v := p.byNode[n.inputs[0].from]
			v.nodes = append(v.nodes, n)
			p.byNode[n] = v
			continue
		}
		v := &vertex{id: len(p.vertices), nodes: []*node{n}, parallelism: n.parallelism, inputs: n.inputs}
		p.vertices = append(p.vertices, v)
		p.byNode[n] = v
	}
	for _, v := range p.vertices {
		v.outputs = v.nodes[len(v.nodes)-1].outputs
	}
	return p, nil
}

// layout describes the plan's operators for AssignState.
func (p *plan) layout() []OperatorLayout {
	var ops []OperatorLayout
	for _, n := range p.job.nodes {
		l := OperatorLayout{UID: n.uid, Parallelism: n.parallelism, Union: n.union, BroadcastState: n.broadcastState}
		if n.keyed {
			l.MaxParallelism = p.job.maxParallelism
		}
		ops = append(ops, l)
	}
	return ops
}

// Describe renders the compiled plan: one line per task vertex with its
// chain, parallelism and input edges.
func (j *Job) Describe() (string, error) {
	p, err := compile(j)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, v := range p.vertices {
		fmt.Fprintf(&b, "%s [parallelism %d]", v.name(), v.parallelism)
		for _, e := range v.inputs {
			fmt.Fprintf(&b, " <-%s- %s", e.kind, p.byNode[e.from].name())
		}
		b.WriteByte('\n')
	}
	return b.String(), nil
}

// Graph is a job's compiled graph: its vertices (chains of operators run as
// one task per subtask) and the edges between them, for a job manager's
// REST API.
type Graph struct {
	Vertices []GraphVertex
	Edges    []GraphEdge
	// MaxParallelism is the job's max parallelism (its key groups).
	MaxParallelism int
}

// GraphVertex is one vertex of a Graph.
type GraphVertex struct {
	// ID is the uid of the chain's head operator; the vertex's tasks are
	// ID#0 ... ID#(Parallelism-1).
	ID string
	// Name is the chain's operator names joined by " -> ".
	Name        string
	Parallelism int
	Tasks       []checkpoint.TaskID
	// Operators are the chain's operator names, head first.
	Operators []string
}

// GraphEdge connects two vertices (by ID); Ship is how records are
// distributed: FORWARD, HASH, REBALANCE or BROADCAST (Flink's ship
// strategy names).
type GraphEdge struct {
	From, To string
	Ship     string
}

// Graph compiles the job and describes its vertices and edges, in
// topological order.
func (j *Job) Graph() (Graph, error) {
	p, err := compile(j)
	if err != nil {
		return Graph{}, err
	}
	g := Graph{MaxParallelism: j.maxParallelism}
	for _, v := range p.vertices {
		gv := GraphVertex{ID: v.nodes[0].uid, Name: v.name(), Parallelism: v.parallelism}
		for i := 0; i < v.parallelism; i++ {
			gv.Tasks = append(gv.Tasks, v.taskID(i))
		}
		for _, n := range v.nodes {
			gv.Operators = append(gv.Operators, n.name)
		}
		g.Vertices = append(g.Vertices, gv)
		for _, e := range v.inputs {
			g.Edges = append(g.Edges, GraphEdge{From: p.byNode[e.from].nodes[0].uid, To: gv.ID, Ship: strings.ToUpper(e.kind.String())})
		}
	}
	return g, nil
}

// slots is the number of slots the job runs in: its largest parallelism
// (slot s holds subtask s of every vertex, SlotShares).
func (p *plan) slots() int {
	n := 1
	for _, v := range p.vertices {
		n = max(n, v.parallelism)
	}
	return n
}
