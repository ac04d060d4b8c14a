package checkpoint

// Savepoints (docs/internals/savepoints.md): a completed checkpoint written
// out of the store into a directory of its own, so that it outlives the job
// and the job manager that took it, can be copied to another machine, and is
// read by later Weir versions.
//
// A savepoint directory holds:
//
//	_metadata          a header line, then JSON: the job, the checkpoint id,
//	                   every operator snapshot with its transaction handles
//	                   and, for each state entry and key group, where its
//	                   bytes are (file, offset, length) and their CRC-32C
//	state/<uid>.bin    the state bytes of one operator, every subtask's
//
// _metadata is written last, atomically: a directory without it is not a
// savepoint (an interrupted write leaves nothing that reads as one). Nothing
// in it names the job manager's store or an absolute path, so the directory
// may be moved.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/weirstream/weir/internal/atomicfile"
)

// SavepointVersion is the format version WriteSavepoint writes. ReadSavepoint
// reads every version up to it and refuses later ones.
const SavepointVersion = 1

// SavepointMetadataFile is the name of a savepoint's metadata file.
const SavepointMetadataFile = "_metadata"

// savepointMagic starts the first line of a savepoint's metadata file.
const savepointMagic = "weir-savepoint"

var (
	// ErrNotSavepoint: the directory holds no savepoint metadata (not a
	// savepoint, or one whose write never finished).
	ErrNotSavepoint = errors.New("not a savepoint")
	// ErrCorruptSavepoint: a savepoint file is truncated, damaged or
	// inconsistent. The error names the file.
	ErrCorruptSavepoint = errors.New("corrupt savepoint")
	// ErrStateNotInline: WriteSavepoint was given a checkpoint whose state
	// is in checkpoint storage (Resolve reads it back first).
	ErrStateNotInline = errors.New("checkpoint state is not inline")
	// ErrSavepointVersion: the savepoint was written by a later format.
	ErrSavepointVersion = errors.New("unsupported savepoint format version")
	// ErrSavepointExists: the target directory is not empty. A savepoint is
	// never overwritten.
	ErrSavepointExists = errors.New("savepoint target not empty")
)

// savepointMeta is the JSON body of _metadata.
type savepointMeta struct {
	Job        string    `json:"job"`
	Checkpoint ID        `json:"checkpoint"`
	CreatedAt  time.Time `json:"created_at"`
	// JobType and JobParams are the registered job type and parameters
	// the job was built from (WithJob); absent in savepoints written
	// without them, which read the same.
	JobType   string            `json:"job_type,omitempty"`
	JobParams map[string]string `json:"job_params,omitempty"`
	Snapshots []savedSnapshot   `json:"snapshots"`
	// version is the format version of the header (not in the JSON).
	version int
}

// savedSnapshot is one OperatorSnapshot with its bytes moved to a state file.
type savedSnapshot struct {
	UID            string      `json:"uid"`
	Subtask        int         `json:"subtask"`
	Parallelism    int         `json:"parallelism"`
	MaxParallelism int         `json:"max_parallelism,omitempty"`
	State          []blobRef   `json:"state,omitempty"`
	KeyGroups      []kgRef     `json:"key_groups,omitempty"`
	Handles        []TxnHandle `json:"handles,omitempty"`
}

type kgRef struct {
	KeyGroup int `json:"key_group"`
	blobRef
}

// blobRef locates bytes in a state file of the savepoint.
type blobRef struct {
	File   string `json:"file"`
	Offset int64  `json:"offset"`
	Length int64  `json:"length"`
	CRC32C uint32 `json:"crc32c"`
}

// WriteSavepoint writes c as a savepoint into dir, which must not exist or be
// empty. Every file is synced before _metadata is written, and _metadata is
// written atomically, so a crash leaves either a complete savepoint or a
// directory that ReadSavepoint refuses with ErrNotSavepoint.
//
// A savepoint is self-contained: c must hold its state inline. A checkpoint
// with references to checkpoint storage is refused (ErrStateNotInline);
// Resolve it first.
func WriteSavepoint(dir string, c Completed, now time.Time, opts ...SavepointOpt) error {
	var cfg savepointConfig
	for _, o := range opts {
		o.apply(&cfg)
	}
	if refs := c.Refs(); len(refs) > 0 {
		return fmt.Errorf("savepoint %s: %w: checkpoint %d references %d state ranges in checkpoint storage (e.g. %s)", dir, ErrStateNotInline, c.ID, len(refs), refs[0].Key)
	}
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("%w: %s", ErrSavepointExists, dir)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("savepoint %s: %w", dir, err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "state"), 0o755); err != nil {
		return fmt.Errorf("savepoint %s: %w", dir, err)
	}
	meta := savepointMeta{Job: c.Job, Checkpoint: c.ID, CreatedAt: now.UTC(), JobType: cfg.jobType, JobParams: cfg.jobParams}
	files := map[string]*stateFile{}
	defer func() {
		for _, f := range files {
			_ = f.f.Close()
		}
	}()
	fileFor := func(uid string) (*stateFile, error) {
		name := path.Join("state", uid+".bin")
		if f, ok := files[name]; ok {
			return f, nil
		}
		f, err := os.OpenFile(filepath.Join(dir, filepath.FromSlash(name)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, fmt.Errorf("savepoint %s: %w", dir, err)
		}
		sf := &stateFile{name: name, f: f, w: bufio.NewWriterSize(f, 1<<20)}
		files[name] = sf
		return sf, nil
	}
	for _, task := range sortedTasks(c) {
		for _, op := range c.Tasks[task].Operators {
			f, err := fileFor(op.UID)
			if err != nil {
				return err
			}
			s := savedSnapshot{UID: op.UID, Subtask: op.Subtask, Parallelism: op.Parallelism,
				MaxParallelism: op.MaxParallelism, Handles: op.Handles}
			for _, e := range op.State {
				ref, err := f.append(e)
				if err != nil {
					return fmt.Errorf("savepoint %s: %w", dir, err)
				}
				s.State = append(s.State, ref)
			}
			kgs := make([]int, 0, len(op.KeyGroups))
			for kg := range op.KeyGroups {
				kgs = append(kgs, kg)
			}
			slices.Sort(kgs)
			for _, kg := range kgs {
				ref, err := f.append(op.KeyGroups[kg])
				if err != nil {
					return fmt.Errorf("savepoint %s: %w", dir, err)
				}
				s.KeyGroups = append(s.KeyGroups, kgRef{KeyGroup: kg, blobRef: ref})
			}
			meta.Snapshots = append(meta.Snapshots, s)
		}
	}
	for _, f := range files {
		if err := f.finish(); err != nil {
			return fmt.Errorf("savepoint %s: %s: %w", dir, f.name, err)
		}
	}
	if err := atomicfile.SyncDir(filepath.Join(dir, "state")); err != nil {
		return fmt.Errorf("savepoint %s: %w", dir, err)
	}
	body, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return fmt.Errorf("savepoint %s: %w", dir, err)
	}
	header := fmt.Sprintf("%s %d crc32c=%08x length=%d\n", savepointMagic, SavepointVersion, crc32.Checksum(body, castagnoli), len(body))
	if err := atomicfile.Write(filepath.Join(dir, SavepointMetadataFile), append([]byte(header), body...)); err != nil {
		return fmt.Errorf("savepoint %s: %w", dir, err)
	}
	return nil
}

type stateFile struct {
	name string
	f    *os.File
	w    *bufio.Writer
	off  int64
}

func (s *stateFile) append(b []byte) (blobRef, error) {
	ref := blobRef{File: s.name, Offset: s.off, Length: int64(len(b)), CRC32C: crc32.Checksum(b, castagnoli)}
	n, err := s.w.Write(b)
	s.off += int64(n)
	return ref, err
}

func (s *stateFile) finish() error {
	if err := s.w.Flush(); err != nil {
		return err
	}
	return s.f.Sync()
}

// ReadSavepoint reads the savepoint in dir back into the checkpoint it was
// written from (task ids are "<uid>#<subtask>": state is matched by
// operator UID on restore, never by task). Every byte is checked against its
// CRC-32C; a missing, truncated or damaged file fails with
// ErrCorruptSavepoint naming it, a directory without _metadata with
// ErrNotSavepoint, a later format with ErrSavepointVersion.
func ReadSavepoint(dir string) (Completed, error) {
	meta, err := readSavepointMeta(dir)
	if err != nil {
		return Completed{}, err
	}
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			_ = f.Close()
		}
	}()
	read := func(ref blobRef, what string) ([]byte, error) {
		corrupt := func(format string, args ...any) error {
			return fmt.Errorf("%w %s: %s: %s: %s", ErrCorruptSavepoint, dir, ref.File, what, fmt.Sprintf(format, args...))
		}
		if !validStateFile(ref.File) {
			return nil, corrupt("not a state file name")
		}
		f, ok := files[ref.File]
		if !ok {
			var err error
			if f, err = os.Open(filepath.Join(dir, filepath.FromSlash(ref.File))); err != nil {
				return nil, corrupt("%v", err)
			}
			files[ref.File] = f
		}
		if ref.Offset < 0 || ref.Length < 0 || ref.Length > 1<<40 {
			return nil, corrupt("bad range %d+%d", ref.Offset, ref.Length)
		}
		fi, err := f.Stat()
		if err != nil {
			return nil, corrupt("%v", err)
		}
		if ref.Offset+ref.Length > fi.Size() {
			return nil, corrupt("truncated: needs bytes %d-%d, the file has %d", ref.Offset, ref.Offset+ref.Length, fi.Size())
		}
		b := make([]byte, ref.Length)
		if _, err := f.ReadAt(b, ref.Offset); err != nil && !errors.Is(err, io.EOF) {
			return nil, corrupt("%v", err)
		}
		if sum := crc32.Checksum(b, castagnoli); sum != ref.CRC32C {
			return nil, corrupt("checksum %08x, want %08x", sum, ref.CRC32C)
		}
		return b, nil
	}
	c := Completed{Job: meta.Job, ID: meta.Checkpoint, CompletedAt: meta.CreatedAt, Tasks: map[TaskID]TaskSnapshot{}}
	for _, s := range meta.Snapshots {
		op := OperatorSnapshot{UID: s.UID, Subtask: s.Subtask, Parallelism: s.Parallelism,
			MaxParallelism: s.MaxParallelism, Handles: s.Handles}
		for i, ref := range s.State {
			b, err := read(ref, fmt.Sprintf("state entry %d of %s#%d", i, s.UID, s.Subtask))
			if err != nil {
				return Completed{}, err
			}
			op.State = append(op.State, b)
		}
		for _, kg := range s.KeyGroups {
			b, err := read(kg.blobRef, fmt.Sprintf("key group %d of %s#%d", kg.KeyGroup, s.UID, s.Subtask))
			if err != nil {
				return Completed{}, err
			}
			if op.KeyGroups == nil {
				op.KeyGroups = map[int][]byte{}
			}
			op.KeyGroups[kg.KeyGroup] = b
		}
		task := TaskID(s.UID + "#" + strconv.Itoa(s.Subtask))
		ts := c.Tasks[task]
		ts.Task = task
		ts.Operators = append(ts.Operators, op)
		c.Tasks[task] = ts
	}
	return c, nil
}

// validStateFile accepts only the state file names WriteSavepoint writes, so
// a crafted _metadata cannot make ReadSavepoint open files outside dir.
func validStateFile(name string) bool {
	base, ok := strings.CutPrefix(name, "state/")
	return ok && strings.HasSuffix(base, ".bin") && base != ".bin" && !strings.ContainsAny(base, `/\`) &&
		filepath.IsLocal(filepath.FromSlash(name))
}

func readSavepointMeta(dir string) (savepointMeta, error) {
	file := filepath.Join(dir, SavepointMetadataFile)
	raw, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Stat(dir); serr != nil {
			return savepointMeta{}, fmt.Errorf("%w: %s: %v", ErrNotSavepoint, dir, serr)
		}
		return savepointMeta{}, fmt.Errorf("%w: %s has no %s (not a savepoint, or its write never finished)", ErrNotSavepoint, dir, SavepointMetadataFile)
	}
	if err != nil {
		return savepointMeta{}, fmt.Errorf("savepoint %s: %w", dir, err)
	}
	corrupt := func(format string, args ...any) (savepointMeta, error) {
		return savepointMeta{}, fmt.Errorf("%w: %s: %s", ErrCorruptSavepoint, file, fmt.Sprintf(format, args...))
	}
	header, body, ok := bytes.Cut(raw, []byte("\n"))
	if !ok {
		return corrupt("no header line")
	}
	if !bytes.HasPrefix(header, []byte(savepointMagic+" ")) {
		return corrupt("header %q does not start with %q", header, savepointMagic)
	}
	var (
		version, length int
		sum             uint32
	)
	if _, err := fmt.Sscanf(string(header), savepointMagic+" %d crc32c=%x length=%d", &version, &sum, &length); err != nil {
		return corrupt("header %q: %v", header, err)
	}
	if version > SavepointVersion || version < 1 {
		return savepointMeta{}, fmt.Errorf("%w: %s is format %d; this Weir reads formats 1 to %d", ErrSavepointVersion, file, version, SavepointVersion)
	}
	if len(body) != length {
		return corrupt("truncated: %d bytes of metadata, the header says %d", len(body), length)
	}
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return corrupt("checksum %08x, want %08x", got, sum)
	}
	var meta savepointMeta
	if err := json.Unmarshal(body, &meta); err != nil {
		return corrupt("%v", err)
	}
	meta.version = version
	return meta, nil
}

// SavepointOpt configures WriteSavepoint.
type SavepointOpt interface{ apply(*savepointConfig) }

type savepointConfig struct {
	jobType   string
	jobParams map[string]string
}

type savepointOpt func(*savepointConfig)

func (o savepointOpt) apply(c *savepointConfig) { o(c) }

// WithJob records the registered job type and the parameters the job was
// built from in the savepoint's metadata, so that a reader can build the
// job's graph again and decode its state through the operators' codecs
// (streamctl state dump). Savepoints written without it read the same.
func WithJob(jobType string, params map[string]string) SavepointOpt {
	return savepointOpt(func(c *savepointConfig) {
		c.jobType = jobType
		c.jobParams = maps.Clone(params)
	})
}

// SavepointInfo is what a savepoint's metadata says of it, besides its
// state.
type SavepointInfo struct {
	// Version is the format version it was written in.
	Version int
	// Job is the id of the job it was taken from; Checkpoint the id of the
	// checkpoint it was written from.
	Job        string
	Checkpoint ID
	// CreatedAt is when it was written.
	CreatedAt time.Time
	// JobType and JobParams are the job type and parameters recorded with
	// WithJob (empty: not recorded).
	JobType   string
	JobParams map[string]string
}

// ReadSavepointInfo reads and checks the metadata of the savepoint in dir,
// not its state files (ReadSavepoint checks those). Its errors are those
// of ReadSavepoint for _metadata.
func ReadSavepointInfo(dir string) (SavepointInfo, error) {
	meta, err := readSavepointMeta(dir)
	if err != nil {
		return SavepointInfo{}, err
	}
	return SavepointInfo{Version: meta.version, Job: meta.Job, Checkpoint: meta.Checkpoint, CreatedAt: meta.CreatedAt,
		JobType: meta.JobType, JobParams: meta.JobParams}, nil
}
