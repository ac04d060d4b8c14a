package checkpoint

// Savepoints (docs/internals/savepoints.md): a completed checkpoint written
// out of the store into a directory of its own, so that it outlives the job
// and the job manager that took it, can be copied to another machine, and is
// read by later Weir versions.
//
// A savepoint is a directory, or the same objects under a place in object
// storage (a savepoint URL, read and written through checkpoint/storage).
// It holds:
//
//	_metadata          a header line, then JSON: the job, the checkpoint id,
//	                   every operator snapshot with its transaction handles
//	                   and, for each state entry and key group, where its
//	                   bytes are (file, offset, length) and their CRC-32C
//	state/<uid>.bin    the state bytes of one operator, every subtask's
//
// _metadata is written last, atomically and only if absent: a location
// without it is not a savepoint (an interrupted write leaves nothing that
// reads as one). Nothing in it names the job manager's store, an absolute
// path or a bucket, so a savepoint may be moved or copied between a
// directory and object storage.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/weirstream/weir/checkpoint/storage"
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
	Watermark      *int64      `json:"watermark,omitempty"`
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

// WriteSavepoint writes c as a savepoint at loc, a directory (which must
// not exist or be empty) or a savepoint URL (IsSavepointURL: a place in
// object storage under which nothing may exist yet). Every state file is
// written whole (in a directory: synced and renamed into place) before
// _metadata is created, and _metadata is created only if absent, so a
// crash leaves either a complete savepoint or a location that ReadSavepoint
// refuses with ErrNotSavepoint, and two writers never both succeed.
//
// A savepoint is self-contained: c must hold its state inline. A checkpoint
// with references to checkpoint storage is refused (ErrStateNotInline);
// Resolve it first.
func WriteSavepoint(ctx context.Context, loc string, c Completed, now time.Time, opts ...SavepointOpt) error {
	cfg := newSavepointConfig(opts)
	if refs := c.Refs(); len(refs) > 0 {
		return fmt.Errorf("savepoint %s: %w: checkpoint %d references %d state ranges in checkpoint storage (e.g. %s)", loc, ErrStateNotInline, c.ID, len(refs), refs[0].Key)
	}
	st, err := openSavepoint(ctx, loc, true, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	errFound := errors.New("found")
	switch err := st.List(ctx, "", func(storage.Object) error { return errFound }); {
	case errors.Is(err, errFound):
		return fmt.Errorf("%w: %s", ErrSavepointExists, loc)
	case err != nil:
		return fmt.Errorf("savepoint %s: %w", loc, err)
	}
	// The state files' layout is planned first (every reference's file,
	// offset and checksum), then each file is written in one piece from
	// the checkpoint's own bytes.
	meta := savepointMeta{Job: c.Job, Checkpoint: c.ID, CreatedAt: now.UTC(), JobType: cfg.jobType, JobParams: cfg.jobParams}
	files := map[string]*stateFile{}
	fileFor := func(uid string) *stateFile {
		name := path.Join("state", uid+".bin")
		f, ok := files[name]
		if !ok {
			f = &stateFile{name: name}
			files[name] = f
		}
		return f
	}
	for _, task := range sortedTasks(c) {
		for _, op := range c.Tasks[task].Operators {
			f := fileFor(op.UID)
			s := savedSnapshot{UID: op.UID, Subtask: op.Subtask, Parallelism: op.Parallelism,
				MaxParallelism: op.MaxParallelism, Handles: op.Handles, Watermark: op.Watermark}
			for _, e := range op.State {
				s.State = append(s.State, f.append(e))
			}
			for _, kg := range slices.Sorted(maps.Keys(op.KeyGroups)) {
				s.KeyGroups = append(s.KeyGroups, kgRef{KeyGroup: kg, blobRef: f.append(op.KeyGroups[kg])})
			}
			meta.Snapshots = append(meta.Snapshots, s)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if err := st.Put(ctx, name, files[name].reader()); err != nil {
			return fmt.Errorf("savepoint %s: %w", loc, err)
		}
	}
	body, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return fmt.Errorf("savepoint %s: %w", loc, err)
	}
	header := fmt.Sprintf("%s %d crc32c=%08x length=%d\n", savepointMagic, SavepointVersion, crc32.Checksum(body, castagnoli), len(body))
	switch err := st.Create(ctx, SavepointMetadataFile, bytes.NewReader(append([]byte(header), body...))); {
	case errors.Is(err, storage.ErrExists):
		return fmt.Errorf("%w: %s", ErrSavepointExists, loc)
	case err != nil:
		return fmt.Errorf("savepoint %s: %w", loc, err)
	}
	return nil
}

// stateFile is the plan of one state file: the byte slices it holds, in
// order.
type stateFile struct {
	name  string
	parts [][]byte
	off   int64
}

func (s *stateFile) append(b []byte) blobRef {
	ref := blobRef{File: s.name, Offset: s.off, Length: int64(len(b)), CRC32C: crc32.Checksum(b, castagnoli)}
	s.parts = append(s.parts, b)
	s.off += int64(len(b))
	return ref
}

func (s *stateFile) reader() io.Reader {
	rs := make([]io.Reader, len(s.parts))
	for i, p := range s.parts {
		rs[i] = bytes.NewReader(p)
	}
	return io.MultiReader(rs...)
}

// ReadSavepoint reads the savepoint at loc (a directory or a savepoint URL,
// as WriteSavepoint takes) back into the checkpoint it was written from
// (task ids are "<uid>#<subtask>": state is matched by operator UID on
// restore, never by task). Every byte is checked against its CRC-32C; a
// missing, truncated or damaged file fails with ErrCorruptSavepoint naming
// it, a location without _metadata with ErrNotSavepoint, a later format
// with ErrSavepointVersion.
func ReadSavepoint(ctx context.Context, loc string, opts ...SavepointOpt) (Completed, error) {
	st, meta, err := openSavepointMeta(ctx, loc, opts)
	if err != nil {
		return Completed{}, err
	}
	defer st.Close()
	// Each state file is read once, whole; the entries are slices of it.
	files := map[string][]byte{}
	read := func(ref blobRef, what string) ([]byte, error) {
		corrupt := func(format string, args ...any) error {
			return fmt.Errorf("%w %s: %s: %s: %s", ErrCorruptSavepoint, loc, ref.File, what, fmt.Sprintf(format, args...))
		}
		if !validStateFile(ref.File) {
			return nil, corrupt("not a state file name")
		}
		b, ok := files[ref.File]
		if !ok {
			r, err := st.Open(ctx, ref.File, 0, -1)
			if err == nil {
				b, err = io.ReadAll(r)
				r.Close()
			}
			if err != nil {
				return nil, fmt.Errorf("%w %s: %s: %s: %w", ErrCorruptSavepoint, loc, ref.File, what, err)
			}
			files[ref.File] = b
		}
		if ref.Offset < 0 || ref.Length < 0 || ref.Length > 1<<40 {
			return nil, corrupt("bad range %d+%d", ref.Offset, ref.Length)
		}
		// The errors name neither the file's size nor the checksum it
		// has: a reader (a job manager) must not tell a client anything
		// of a file's contents it could not read itself.
		if end := ref.Offset + ref.Length; end > int64(len(b)) {
			return nil, corrupt("truncated: needs bytes %d-%d", ref.Offset, end)
		}
		e := b[ref.Offset : ref.Offset+ref.Length : ref.Offset+ref.Length]
		if crc32.Checksum(e, castagnoli) != ref.CRC32C {
			return nil, corrupt("checksum mismatch")
		}
		return e, nil
	}
	c := Completed{Job: meta.Job, ID: meta.Checkpoint, CompletedAt: meta.CreatedAt, Tasks: map[TaskID]TaskSnapshot{}}
	for _, s := range meta.Snapshots {
		op := OperatorSnapshot{UID: s.UID, Subtask: s.Subtask, Parallelism: s.Parallelism,
			MaxParallelism: s.MaxParallelism, Handles: s.Handles, Watermark: s.Watermark}
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

// IsSavepointURL reports whether a savepoint location is a URL of object
// storage (s3://bucket/prefix?endpoint=..., file:///abs/dir: what
// storage.Open takes) rather than a directory path.
func IsSavepointURL(loc string) bool {
	scheme, _, ok := strings.Cut(loc, "://")
	return ok && scheme != "" && !strings.ContainsAny(scheme, `/\.`)
}

// JoinSavepointLocation names location name under base, a directory or a
// savepoint URL (whose query, such as an endpoint, it keeps). A directory
// is made absolute.
func JoinSavepointLocation(base, name string) (string, error) {
	if !IsSavepointURL(base) {
		abs, err := filepath.Abs(base)
		if err != nil {
			return "", fmt.Errorf("savepoint location %s: %w", base, err)
		}
		return filepath.Join(abs, name), nil
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("%w %q: %v", storage.ErrBadURL, base, err)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/" + name
	u.RawPath = ""
	return u.String(), nil
}

// openSavepoint opens the storage a savepoint location names: for a
// directory, the file storage rooted at it (created only to write).
func openSavepoint(ctx context.Context, loc string, write bool, cfg savepointConfig) (storage.Storage, error) {
	if IsSavepointURL(loc) {
		opts := cfg.storage
		if cfg.beneath != "" {
			opts = append(slices.Clip(opts), storage.Beneath(cfg.beneath))
		}
		st, err := storage.Open(ctx, loc, opts...)
		if err != nil {
			return nil, fmt.Errorf("savepoint %s: %w", loc, err)
		}
		return st, nil
	}
	abs, err := filepath.Abs(loc)
	if err != nil {
		return nil, fmt.Errorf("savepoint %s: %w", loc, err)
	}
	fileURL := (&url.URL{Scheme: "file", Path: filepath.ToSlash(abs)}).String()
	if cfg.beneath != "" {
		// Nothing is looked at before the confined store: it follows no
		// link, and a missing _metadata says "not a savepoint".
		st, err := storage.Open(ctx, fileURL, storage.Beneath(cfg.beneath))
		if err != nil {
			return nil, fmt.Errorf("savepoint %s: %w", loc, err)
		}
		return st, nil
	}
	if !write {
		fi, err := os.Stat(abs)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrNotSavepoint, loc, err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("%w: %s is not a directory", ErrNotSavepoint, loc)
		}
	}
	st, err := storage.Open(ctx, fileURL)
	if err != nil {
		return nil, fmt.Errorf("savepoint %s: %w", loc, err)
	}
	return st, nil
}

// validStateFile accepts only the state file names WriteSavepoint writes, so
// a crafted _metadata cannot make ReadSavepoint open files outside dir.
func validStateFile(name string) bool {
	base, ok := strings.CutPrefix(name, "state/")
	return ok && strings.HasSuffix(base, ".bin") && base != ".bin" && !strings.ContainsAny(base, `/\`) &&
		filepath.IsLocal(filepath.FromSlash(name))
}

// openSavepointMeta opens the savepoint at loc for reading and reads its
// metadata; the caller closes the storage.
func openSavepointMeta(ctx context.Context, loc string, opts []SavepointOpt) (storage.Storage, savepointMeta, error) {
	st, err := openSavepoint(ctx, loc, false, newSavepointConfig(opts))
	if err != nil {
		return nil, savepointMeta{}, err
	}
	meta, err := readSavepointMeta(ctx, st, loc)
	if err != nil {
		st.Close()
		return nil, savepointMeta{}, err
	}
	return st, meta, nil
}

func readSavepointMeta(ctx context.Context, st storage.Storage, loc string) (savepointMeta, error) {
	file, err := JoinSavepointLocation(loc, SavepointMetadataFile)
	if err != nil {
		return savepointMeta{}, err
	}
	r, err := st.Open(ctx, SavepointMetadataFile, 0, -1)
	if errors.Is(err, storage.ErrNotFound) {
		return savepointMeta{}, fmt.Errorf("%w: %s has no %s (not a savepoint, or its write never finished)", ErrNotSavepoint, loc, SavepointMetadataFile)
	}
	if err != nil {
		return savepointMeta{}, fmt.Errorf("savepoint %s: %w", loc, err)
	}
	raw, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		return savepointMeta{}, fmt.Errorf("savepoint %s: %w", loc, err)
	}
	corrupt := func(format string, args ...any) (savepointMeta, error) {
		return savepointMeta{}, fmt.Errorf("%w: %s: %s", ErrCorruptSavepoint, file, fmt.Sprintf(format, args...))
	}
	header, body, ok := bytes.Cut(raw, []byte("\n"))
	if !ok {
		return corrupt("no header line")
	}
	// The errors never quote the file: what it holds is not echoed to
	// whoever named it (a job manager's client).
	if !bytes.HasPrefix(header, []byte(savepointMagic+" ")) {
		return corrupt("the first line is not a %q header", savepointMagic)
	}
	var (
		version, length int
		sum             uint32
	)
	if _, err := fmt.Sscanf(string(header), savepointMagic+" %d crc32c=%x length=%d", &version, &sum, &length); err != nil {
		return corrupt("malformed %q header", savepointMagic)
	}
	if version > SavepointVersion || version < 1 {
		return savepointMeta{}, fmt.Errorf("%w: %s is format %d; this Weir reads formats 1 to %d", ErrSavepointVersion, file, version, SavepointVersion)
	}
	if len(body) != length {
		return corrupt("truncated metadata")
	}
	if crc32.Checksum(body, castagnoli) != sum {
		return corrupt("checksum mismatch")
	}
	var meta savepointMeta
	if err := json.Unmarshal(body, &meta); err != nil {
		return corrupt("the metadata is not the JSON of a savepoint")
	}
	meta.version = version
	return meta, nil
}

// SavepointOpt configures WriteSavepoint.
type SavepointOpt interface{ apply(*savepointConfig) }

type savepointConfig struct {
	jobType   string
	jobParams map[string]string
	storage   []storage.Opt
	beneath   string
}

func newSavepointConfig(opts []SavepointOpt) savepointConfig {
	var cfg savepointConfig
	for _, o := range opts {
		o.apply(&cfg)
	}
	return cfg
}

type savepointOpt func(*savepointConfig)

func (o savepointOpt) apply(c *savepointConfig) { o(c) }

// StorageOptions configures how a savepoint URL's object storage is opened
// (storage.Open's options, such as storage.Credentials); directories
// ignore it.
func StorageOptions(opts ...storage.Opt) SavepointOpt {
	return savepointOpt(func(c *savepointConfig) { c.storage = append(c.storage, opts...) })
}

// Beneath confines a savepoint directory (or file:// URL) to the directory
// root, as storage.Beneath does: it must be root or below it, and no path
// component below root, of the location or of its files, may be a symbolic
// link; none is followed, however the tree changes while it is read or
// written. It is how a job manager reads and writes a location a client
// named (after checking that it lies under an allowed root); object
// storage URLs ignore it.
func Beneath(root string) SavepointOpt {
	return savepointOpt(func(c *savepointConfig) { c.beneath = root })
}

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

// ReadSavepointInfo reads and checks the metadata of the savepoint at loc,
// not its state files (ReadSavepoint checks those). Its errors are those
// of ReadSavepoint for _metadata.
func ReadSavepointInfo(ctx context.Context, loc string, opts ...SavepointOpt) (SavepointInfo, error) {
	st, meta, err := openSavepointMeta(ctx, loc, opts)
	if err != nil {
		return SavepointInfo{}, err
	}
	st.Close()
	return SavepointInfo{Version: meta.version, Job: meta.Job, Checkpoint: meta.Checkpoint, CreatedAt: meta.CreatedAt,
		JobType: meta.JobType, JobParams: meta.JobParams}, nil
}
