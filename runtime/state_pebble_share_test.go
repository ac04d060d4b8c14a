package runtime

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"
)

// slotMemoryProbe is a keyed counter that records, at every record, what
// the open instances of its state memory take of the budget.
type slotMemoryProbe struct {
	seen *sync.Map // *StateMemory -> *slotMemorySeen
	mem  *StateMemory
	n    *ValueState[int64]
}

type slotMemorySeen struct{ bytes, instances atomic.Int64 }

func (p *slotMemoryProbe) Open(_ context.Context, st *StateRegistry[string]) (err error) {
	p.mem = st.oc.stateMem
	p.n, err = NewValueState[int64](st, "n", nil)
	return err
}

func (p *slotMemoryProbe) Process(_ string, r seqRec, out Collector[seqRec]) error {
	n, _ := p.n.Value()
	p.n.Update(n + 1)
	v, _ := p.seen.LoadOrStore(p.mem, &slotMemorySeen{})
	s := v.(*slotMemorySeen)
	bytes, instances := p.mem.reserved()
	if int64(instances) > s.instances.Load() {
		s.instances.Store(int64(instances))
	}
	if bytes > s.bytes.Load() {
		s.bytes.Store(bytes)
	}
	out.Collect(r)
	return nil
}

// The keyed operators of one slot split the slot's state memory, as Flink
// splits a slot's managed memory between its operators: a job of two
// keyed operators in task managers of one slot each takes no more of a
// task manager's budget than a job of one would (each instance used to
// take the whole slot's share: twice the memtable half of the budget).
func TestTheKeyedOperatorsOfASlotSplitItsStateMemory(t *testing.T) {
	const budget = 64 << 20
	for _, tc := range []struct {
		name      string
		tms       int   // task managers of one slot each; 0: a mini cluster
		instances int64 // keyed subtasks per state memory
	}{
		{name: "two task managers of one slot", tms: 2, instances: 2},
		{name: "a mini cluster", tms: 0, instances: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := NewJob("slots", DefaultParallelism(2), StateBackend(PebbleState))
			src := FromSource(j, "source", seqSourceOf(seqSource{keys: 200, splits: 2, n: 50, perPoll: 100}))
			seen := &sync.Map{}
			probe := func() KeyedProcessFunction[string, seqRec, seqRec] { return &slotMemoryProbe{seen: seen} }
			key := func(r seqRec) string { return r.Key }
			first := Process(KeyBy(src, key, nil), "first", probe)
			second := Process(KeyBy(first, key, nil), "second", probe)
			SinkTo(second, "sink", func() Sink[seqRec] { return discardSink[seqRec]{} })
			opts := []ClusterOpt{CheckpointInterval(50 * time.Millisecond), StateMemoryLimit(budget)}
			if tc.tms > 0 {
				d := splitDeployer{job: j, parts: tc.tms, sent: &atomic.Int64{}}
				for range tc.tms {
					m, err := NewStateMemory(StateDir(t.TempDir()), StateMemoryBudget(budget), StateSlots(1))
					if err != nil {
						t.Fatal(err)
					}
					defer m.Close()
					d.mems = append(d.mems, m)
				}
				opts = append(opts, Deployment(d))
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			if _, err := NewMiniCluster(opts...).Run(ctx, j); err != nil {
				t.Fatal(err)
			}
			mems := 0
			seen.Range(func(k, v any) bool {
				mems++
				s := v.(*slotMemorySeen)
				if s.instances.Load() != tc.instances {
					t.Errorf("a state memory seen with at most %d open instances, want %d (the test saw no moment with all open)", s.instances.Load(), tc.instances)
				}
				if s.bytes.Load() > budget/2 {
					t.Errorf("%d instances took %d bytes of memtables and caches, above the budget's half (%d)", s.instances.Load(), s.bytes.Load(), budget/2)
				}
				return true
			})
			if want := max(tc.tms, 1); mems != want {
				t.Errorf("%d state memories seen, want %d", mems, want)
			}
		})
	}
}

// The default budget is an eighth of what the process may use: the
// machine's memory, or its container's cgroup limit where that is lower
// (a task manager in a pod of a large node must not size its caches for
// the node).
func TestTheDefaultStateMemoryIsAnEighthOfTheMachineOrItsContainersLimit(t *testing.T) {
	const gib = int64(1) << 30
	meminfo := &fstest.MapFile{Data: []byte("MemTotal:       25165824 kB\nMemFree:        1000 kB\n")} // 24 GiB
	for _, tc := range []struct {
		name  string
		files fstest.MapFS
		want  int64
	}{
		{"the machine", fstest.MapFS{"proc/meminfo": meminfo}, 3 * gib},
		{"a cgroup v2 limit", fstest.MapFS{"proc/meminfo": meminfo, "sys/fs/cgroup/memory.max": {Data: []byte("4294967296\n")}}, gib / 2},
		{"a cgroup v2 without a limit", fstest.MapFS{"proc/meminfo": meminfo, "sys/fs/cgroup/memory.max": {Data: []byte("max\n")}}, 3 * gib},
		{"a cgroup v1 limit", fstest.MapFS{"proc/meminfo": meminfo, "sys/fs/cgroup/memory/memory.limit_in_bytes": {Data: []byte("8589934592\n")}}, gib},
		{"a cgroup v1 without a limit", fstest.MapFS{"proc/meminfo": meminfo, "sys/fs/cgroup/memory/memory.limit_in_bytes": {Data: []byte("9223372036854771712\n")}}, 3 * gib},
		{"a limit above the machine", fstest.MapFS{"proc/meminfo": meminfo, "sys/fs/cgroup/memory.max": {Data: []byte("68719476736\n")}}, 3 * gib},
		{"a small container: the floor", fstest.MapFS{"proc/meminfo": meminfo, "sys/fs/cgroup/memory.max": {Data: []byte("1073741824\n")}}, 256 << 20},
		{"a limit without meminfo", fstest.MapFS{"sys/fs/cgroup/memory.max": {Data: []byte("4294967296\n")}}, gib / 2},
		{"nothing known", fstest.MapFS{}, gib},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := defaultStateMemory(tc.files); got != tc.want {
				t.Errorf("default budget %d bytes, want %d", got, tc.want)
			}
		})
	}
}
