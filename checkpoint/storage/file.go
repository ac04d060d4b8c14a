package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/weirstream/weir/internal/atomicfile"
)

// fileStore keeps objects as files below a directory. A write goes to a
// temporary file (a name starting with "."), is synced, and is renamed
// (Put) or hard-linked (Create, which fails if the name exists) into place;
// the directory is synced after.
type fileStore struct{ root string }

func openFile(root string) (Storage, error) {
	root = filepath.Clean(root)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("checkpoint storage directory %s: %w", root, err)
	}
	return &fileStore{root: root}, nil
}

func (s *fileStore) path(key string) string { return filepath.Join(s.root, filepath.FromSlash(key)) }

// writeTemp writes body to a synced temporary file beside key's path.
func (s *fileStore) writeTemp(key string, body io.Reader) (string, error) {
	dir := filepath.Dir(s.path(key))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("write %s: %w", key, err)
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return "", fmt.Errorf("write %s: %w", key, err)
	}
	_, err = io.Copy(f, body)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("write %s: %w", key, err)
	}
	return f.Name(), nil
}

func (s *fileStore) Put(ctx context.Context, key string, body io.Reader) error {
	if err := checkKey(key); err != nil {
		return err
	}
	tmp, err := s.writeTemp(key, body)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, s.path(key)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", key, err)
	}
	return atomicfile.SyncDir(filepath.Dir(s.path(key)))
}

func (s *fileStore) Create(ctx context.Context, key string, body io.Reader) error {
	if err := checkKey(key); err != nil {
		return err
	}
	tmp, err := s.writeTemp(key, body)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	// link(2) fails if the name exists: the create-if-absent of a file
	// system, atomic against concurrent Creates.
	if err := os.Link(tmp, s.path(key)); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create %s: %w", key, ErrExists)
		}
		return fmt.Errorf("create %s: %w", key, err)
	}
	return atomicfile.SyncDir(filepath.Dir(s.path(key)))
}

func (s *fileStore) Open(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	f, err := os.Open(s.path(key))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	st, err := f.Stat()
	if err == nil && st.IsDir() {
		err = ErrNotFound
	}
	if err == nil && off > st.Size() {
		err = ErrBeyondEnd
	}
	if err == nil {
		_, err = f.Seek(off, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("read %s at %d: %w", key, off, err)
	}
	if n < 0 {
		return f, nil
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(f, n), f}, nil
}

func (s *fileStore) List(ctx context.Context, prefix string, fn func(Object) error) error {
	if err := checkPrefix(prefix); err != nil {
		return err
	}
	// Walk only the directory the prefix's complete segments name.
	start := s.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		start = s.path(prefix[:i])
	}
	var objs []Object
	err := filepath.WalkDir(start, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() && path != start {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return ctx.Err()
		}
		rel, err := filepath.Rel(s.root, path)
		if err != nil {
			return err
		}
		objs, err = appendObject(objs, filepath.ToSlash(rel), prefix, d)
		return err
	})
	if err != nil {
		return fmt.Errorf("list %s: %w", prefix, err)
	}
	return eachByKey(objs, fn)
}

func (s *fileStore) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	p := s.path(key)
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	// Remove directories the delete emptied, up to the root (best effort:
	// a concurrent write may have filled one again).
	for dir := filepath.Dir(p); dir != s.root && strings.HasPrefix(dir, s.root); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			break
		}
	}
	return nil
}

func (s *fileStore) Close() error { return nil }

// appendObject appends the object of file d, stored under key, to objs
// when key has prefix (a listing of the file stores).
func appendObject(objs []Object, key, prefix string, d fs.DirEntry) ([]Object, error) {
	if !strings.HasPrefix(key, prefix) {
		return objs, nil
	}
	info, err := d.Info()
	if err != nil {
		return objs, err
	}
	return append(objs, Object{Key: key, Size: info.Size(), Modified: info.ModTime()}), nil
}

// eachByKey calls fn with objs in key order (a listing of the file
// stores), stopping at its first error.
func eachByKey(objs []Object, fn func(Object) error) error {
	sort.Slice(objs, func(i, j int) bool { return objs[i].Key < objs[j].Key })
	for _, o := range objs {
		if err := fn(o); err != nil {
			return err
		}
	}
	return nil
}
