package runtime

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
)

// StateMemory is what the pebble state backends of one task manager share:
// a memory budget and the directory their instances live in. The budget
// bounds the memory pebble takes, whatever the size of the state (Flink's
// managed memory): half of it is one block cache shared by every instance,
// the other half is split evenly between the task manager's slots, a
// slot's share evenly between the instances in it (a slot holds subtask s
// of every vertex of a job, so one instance per keyed operator; Flink
// splits a slot's managed memory between its operators the same way), and
// each instance's share in three: two memtables (pebble keeps up to two per
// instance before it stalls writes; each is budget/2/slots/instances/3) and
// the write-back cache of the instance's value states (pebbleValue). State
// beyond the budget lives on disk.
type StateMemory struct {
	cfg   stateMemoryCfg
	fs    vfs.FS
	cache *pebble.Cache

	mu     sync.Mutex
	seq    int
	open   map[*pebbleState]struct{}
	closed bool
}

type stateMemoryCfg struct {
	dir       string
	removeDir bool
	budget    int64
	slots     int
	fs        vfs.FS
	log       *zap.Logger
}

// StateMemoryOpt configures a StateMemory.
type StateMemoryOpt interface{ apply(*stateMemoryCfg) }

type stateMemoryOpt func(*stateMemoryCfg)

func (o stateMemoryOpt) apply(c *stateMemoryCfg) { o(c) }

// StateDir is the directory the pebble instances live in, emptied by
// NewStateMemory: what a killed task manager left there is of no use, as
// state is restored from checkpoints (default: a new temporary directory,
// removed by Close).
func StateDir(dir string) StateMemoryOpt {
	return stateMemoryOpt(func(c *stateMemoryCfg) { c.dir = dir })
}

// StateMemoryBudget is the memory budget in bytes (default
// DefaultStateMemory()).
func StateMemoryBudget(bytes int64) StateMemoryOpt {
	return stateMemoryOpt(func(c *stateMemoryCfg) { c.budget = bytes })
}

// StateSlots is the number of slots that share the budget's memtables: a
// task manager's slots, a mini cluster's (its job's largest parallelism)
// (default 1). The instances of one slot split its share.
func StateSlots(n int) StateMemoryOpt {
	return stateMemoryOpt(func(c *stateMemoryCfg) { c.slots = n })
}

// StateLogger logs what pebble reports (default: nothing).
func StateLogger(l *zap.Logger) StateMemoryOpt {
	return stateMemoryOpt(func(c *stateMemoryCfg) { c.log = l })
}

// stateFS puts the instances on fs (tests: a crash-clone or error-injecting
// filesystem).
func stateFS(fs vfs.FS) StateMemoryOpt {
	return stateMemoryOpt(func(c *stateMemoryCfg) { c.fs = fs })
}

// minStateMemory is the smallest budget accepted: pebble's memtables need
// a few MiB.
const minStateMemory = 16 << 20

// DefaultStateMemory is the default budget: an eighth of the memory the
// process may use, at least 256 MiB; 1 GiB where that is unknown. The
// memory the process may use is the machine's (/proc/meminfo MemTotal) or
// its container's limit where lower (cgroup v2 memory.max, v1
// memory.limit_in_bytes): a task manager in a Kubernetes pod takes an
// eighth of the pod's limit, not of the node. An eighth leaves room for
// several task managers per machine and for the heap of the tasks
// themselves.
func DefaultStateMemory() int64 {
	return defaultStateMemory(os.DirFS("/"))
}

func defaultStateMemory(root fs.FS) int64 {
	total := memoryLimit(root)
	if total <= 0 {
		return 1 << 30
	}
	return max(total/8, 256<<20)
}

// memoryLimit is what the process may use, in bytes (0: unknown): MemTotal
// of proc/meminfo, or the container's cgroup limit where it is lower.
// root is the filesystem root.
func memoryLimit(root fs.FS) int64 {
	total := memTotal(root)
	for _, f := range []string{"sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := fs.ReadFile(root, f)
		if err != nil {
			continue
		}
		// "max" (v2) or a value near 2^63 (v1): no limit.
		l, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err == nil && l > 0 && (total <= 0 || l < total) {
			total = l
		}
	}
	return total
}

// memTotal is MemTotal of proc/meminfo under root, in bytes (0: unknown).
func memTotal(root fs.FS) int64 {
	f, err := root.Open("proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil {
			return 0
		}
		return kb << 10
	}
	return 0
}

// NewStateMemory makes a task manager's state memory.
func NewStateMemory(opts ...StateMemoryOpt) (*StateMemory, error) {
	cfg := stateMemoryCfg{slots: 1, log: zap.NewNop()}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if cfg.budget == 0 {
		cfg.budget = DefaultStateMemory()
	}
	if cfg.budget < minStateMemory {
		return nil, fmt.Errorf("state memory %d bytes: below the minimum of %d", cfg.budget, minStateMemory)
	}
	if cfg.slots < 1 {
		cfg.slots = 1
	}
	fs := cfg.fs
	if fs == nil {
		fs = vfs.Default
	}
	if cfg.dir == "" {
		if cfg.fs != nil {
			return nil, errors.New("state memory on a custom filesystem needs StateDir")
		}
		d, err := os.MkdirTemp("", "weir-state-*")
		if err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
		cfg.dir, cfg.removeDir = d, true
	} else {
		if err := fs.RemoveAll(cfg.dir); err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
		if err := fs.MkdirAll(cfg.dir, 0o755); err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
	}
	return &StateMemory{cfg: cfg, fs: fs, cache: pebble.NewCache(cfg.budget / 2), open: map[*pebbleState]struct{}{}}, nil
}

// Budget is the memory budget in bytes.
func (m *StateMemory) Budget() int64 { return m.cfg.budget }

// Dir is the directory the instances live in.
func (m *StateMemory) Dir() string { return m.cfg.dir }

// reserved is what the open instances take of the budget's memtable half
// at most: two memtables and a write-back cache bound each.
func (m *StateMemory) reserved() (bytes int64, instances int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for p := range m.open {
		bytes += 2*int64(p.memTable) + int64(p.cacheLimit)
	}
	return bytes, len(m.open)
}

// DiskUsage is the size on disk of every open instance, in bytes.
func (m *StateMemory) DiskUsage() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n uint64
	for p := range m.open {
		n += p.diskUsage()
	}
	return int64(n)
}

// instanceShare is the bytes of the budget's memtable half that one of
// the instances sharing a slot takes (share: how many; at least 1).
func (m *StateMemory) instanceShare(share int) int64 {
	return m.cfg.budget / 2 / int64(m.cfg.slots) / int64(max(share, 1))
}

// memTableSize is the memtable size of an instance of a slot of share
// instances: a third of its share (pebble keeps up to two memtables), the
// last third being its states' write-back caches (cacheBytes); at most
// maxMemTable.
func (m *StateMemory) memTableSize(share int) uint64 {
	return uint64(min(max(m.instanceShare(share)/3, 1<<20), maxMemTable))
}

// maxMemTable caps an instance's memtable: a checkpoint's synchronous part
// flushes the memtable, so its size is the barrier's flush (a 3 GiB
// budget over two slots made 256 MiB memtables, seconds to flush on a
// loaded machine; docs/guide/state-backends.md). 64 MiB is the write
// buffer of Flink's RocksDB backend. Pebble flushes a full memtable in the
// background, so between barriers smaller memtables cost more, smaller
// flushes, not waits. The budget's memtable share beyond two of them is
// left unused.
const maxMemTable = 64 << 20

// cacheBytes bounds the bytes the value states of an instance of a slot
// of share instances cache (pebbleValue).
func (m *StateMemory) cacheBytes(share int) int {
	return int(max(m.instanceShare(share)/3, 1<<20))
}

// openInstance opens a new, empty pebble instance for a keyed operator
// subtask holding the key groups [0, maxPar).
func (m *StateMemory) openInstance(name string, maxPar int) (*pebbleState, error) {
	return m.openInstanceFrom(context.Background(), name, maxPar, 0, maxPar, 1, nil, nil)
}

// openInstanceFrom opens a new pebble instance for a keyed operator
// subtask holding the key groups [lo, hi), one of share instances of its
// slot: empty, or restored from the native snapshots handles in st
// (openNative).
func (m *StateMemory) openInstanceFrom(ctx context.Context, name string, maxPar, lo, hi, share int, st storage.Storage, handles []*checkpoint.NativeState) (*pebbleState, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, errors.New("state memory closed")
	}
	m.seq++
	dir := m.fs.PathJoin(m.cfg.dir, fmt.Sprintf("%s-%d", sanitizeDirName(name), m.seq))
	m.mu.Unlock()
	// A new instance is empty: the state comes from the restore only.
	if err := m.fs.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("pebble state %s: %w", dir, err)
	}
	if err := m.fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("pebble state %s: %w", dir, err)
	}
	opts := &pebble.Options{
		FS:                          m.fs,
		Cache:                       m.cache,
		MemTableSize:                m.memTableSize(share),
		MemTableStopWritesThreshold: 2,
		// The state is rebuilt from the latest checkpoint after a failure:
		// it needs no write-ahead log (Flink's RocksDB backend writes none).
		DisableWAL: true,
		Logger:     stateLogger{m.cfg.log},
		// Excise (a restore at other key groups) needs virtual SSTs.
		FormatMajorVersion: pebble.FormatNewest,
	}
	var db *pebble.DB
	var meta nativeMeta
	var err error
	if len(handles) > 0 {
		db, meta, err = openNative(ctx, st, m.fs, dir, opts, handles, lo, hi)
	} else {
		db, err = pebble.Open(dir, opts)
	}
	if err != nil {
		_ = m.fs.RemoveAll(dir)
		return nil, fmt.Errorf("pebble state %s: %w", dir, err)
	}
	p := &pebbleState{mem: m, db: db, dir: dir, maxPar: maxPar, kgLo: lo, kgHi: hi, memTable: opts.MemTableSize, cacheLimit: m.cacheBytes(share), dirtyMax: maxDirtyBytes, chunk: opts.MemTableSize / 8,
		snaps: map[*pebble.Snapshot]struct{}{}, staging: map[string]struct{}{}, infos: map[uint16]*pebbleStateInfo{}}
	if len(handles) > 0 {
		p.native, p.restoredNext = true, map[uint16]uint64{}
		for _, in := range meta.States {
			p.infos[in.ID] = &pebbleStateInfo{ID: in.ID, Name: in.Name, Kind: in.Kind, Next: in.Next}
			p.restoredNext[in.ID] = in.Next
			p.nextID = max(p.nextID, in.ID+1)
		}
	}
	m.mu.Lock()
	m.open[p] = struct{}{}
	m.mu.Unlock()
	return p, nil
}

// forget forgets a closed instance.
func (m *StateMemory) forget(p *pebbleState) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.open, p)
}

// Close releases the block cache and removes the directory if
// NewStateMemory made it. The instances must be closed first.
func (m *StateMemory) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	n := len(m.open)
	m.mu.Unlock()
	m.cache.Unref()
	var err error
	if n > 0 {
		err = fmt.Errorf("state memory closed with %d pebble instances open", n)
	}
	if m.cfg.removeDir {
		err = errors.Join(err, os.RemoveAll(m.cfg.dir))
	}
	return err
}

// sanitizeDirName keeps letters, digits, '-' and '_' of an operator name.
func sanitizeDirName(s string) string {
	s = filepath.Base(s)
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) > 48 {
		b = b[:48]
	}
	return string(b)
}

// stateLogger sends pebble's messages to zap; a fatal one panics (pebble's
// default exits the process): the task fails and the job restarts from its
// checkpoint.
type stateLogger struct{ l *zap.Logger }

func (s stateLogger) Infof(format string, args ...any) {
	s.l.Debug(fmt.Sprintf(format, args...))
}

func (s stateLogger) Errorf(format string, args ...any) {
	s.l.Warn(fmt.Sprintf(format, args...))
}

func (s stateLogger) Fatalf(format string, args ...any) {
	panic(fmt.Errorf("pebble state: "+format, args...))
}
