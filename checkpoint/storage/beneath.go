package storage

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

var (
	// ErrNotBeneath is returned by Open when a file:// URL names a
	// directory outside the root Beneath confines it to.
	ErrNotBeneath = errors.New("not beneath the storage root")
	// ErrSymlink is returned when a path component below a Beneath root is
	// a symbolic link (or was swapped for one while it was opened).
	ErrSymlink = errors.New("symbolic link refused")
)

// Beneath confines a file:// store to the directory root: the store's
// directory must be root or below it (ErrNotBeneath otherwise), and no path
// component below root, of the store's directory or of a key, may be a
// symbolic link: none is ever followed (ErrSymlink). Every access opens the
// path one component at a time, each relative to the directory opened
// before (os.Root), and checks that what it opened is what it looked at,
// so a tree changed meanwhile cannot lead it elsewhere. Only regular files
// are read. Such a store creates its directory only when it first writes,
// and its Delete leaves emptied directories in place. It is how a job
// manager opens a directory a client named; s3:// and mem:// ignore it.
func Beneath(root string) Opt {
	return opt(func(c *cfg) { c.beneath = root })
}

// beneathStore is a fileStore confined to a root without symlinks.
type beneathStore struct {
	// root is the absolute root; rel the store's directory below it
	// (slash-separated, "" for root itself).
	root, rel string
}

func openBeneath(root, dir string) (Storage, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("storage root %s: %w", root, err)
	}
	rel, err := filepath.Rel(root, filepath.Clean(dir))
	if err != nil || !filepath.IsLocal(rel) && rel != "." {
		return nil, fmt.Errorf("%s: %w %s", dir, ErrNotBeneath, root)
	}
	if rel == "." {
		rel = ""
	}
	return &beneathStore{root: root, rel: filepath.ToSlash(rel)}, nil
}

// openDir opens the directory sub (slash-separated, relative to the
// store's directory; "" for the store's directory) component by component,
// refusing symbolic links; with create it makes missing directories. A
// missing directory is fs.ErrNotExist.
func (s *beneathStore) openDir(sub string, create bool) (*os.Root, error) {
	r, err := os.OpenRoot(s.root)
	if err != nil {
		return nil, err
	}
	for _, name := range strings.Split(path.Join(s.rel, sub), "/") {
		if name == "" || name == "." {
			continue
		}
		next, err := stepDir(r, name, create)
		r.Close()
		if err != nil {
			return nil, err
		}
		r = next
	}
	return r, nil
}

// stepDir opens directory name in r without following a symbolic link.
func stepDir(r *os.Root, name string, create bool) (*os.Root, error) {
	if create {
		if err := r.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
	}
	fi, err := r.Lstat(name)
	if err != nil {
		return nil, err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return nil, fmt.Errorf("%s: %w", name, ErrSymlink)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s: not a directory: %w", name, fs.ErrNotExist)
	}
	next, err := r.OpenRoot(name)
	if err != nil {
		return nil, err
	}
	// Swapped for a symlink between the Lstat and the open: what was
	// opened is not what was looked at.
	if st, err := next.Stat("."); err != nil || !os.SameFile(fi, st) {
		next.Close()
		return nil, fmt.Errorf("%s: %w", name, ErrSymlink)
	}
	return next, nil
}

func (s *beneathStore) err(op, key string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s %s: %w", op, key, ErrNotFound)
	}
	// An *fs.PathError names the root's absolute path: name the key only.
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return fmt.Errorf("%s %s: %w", op, key, err)
}

// write writes body to a synced temporary file in key's directory and
// hands it to place (a rename or a link), then syncs the directory.
func (s *beneathStore) write(op, key string, body io.Reader, place func(d *os.Root, tmp, name string) error) error {
	if err := checkKey(key); err != nil {
		return err
	}
	dir, name := path.Split(key)
	d, err := s.openDir(dir, true)
	if err != nil {
		return s.err(op, key, err)
	}
	defer d.Close()
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := ".tmp-" + hex.EncodeToString(rnd[:])
	// O_EXCL: never through a link someone put at the name.
	f, err := d.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return s.err(op, key, err)
	}
	_, err = io.Copy(f, body)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = place(d, tmp, name)
	}
	if op == "create" || err != nil {
		_ = d.Remove(tmp)
	}
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s %s: %w", op, key, ErrExists)
		}
		return s.err(op, key, err)
	}
	df, err := d.Open(".")
	if err != nil {
		return s.err(op, key, err)
	}
	defer df.Close()
	if err := df.Sync(); err != nil {
		return s.err(op, key, err)
	}
	return nil
}

func (s *beneathStore) Put(ctx context.Context, key string, body io.Reader) error {
	// A rename replaces a symlink at the name, never its target.
	return s.write("write", key, body, func(d *os.Root, tmp, name string) error { return d.Rename(tmp, name) })
}

func (s *beneathStore) Create(ctx context.Context, key string, body io.Reader) error {
	// link(2) fails if the name exists, as a symlink too.
	return s.write("create", key, body, func(d *os.Root, tmp, name string) error { return d.Link(tmp, name) })
}

func (s *beneathStore) Open(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	dir, name := path.Split(key)
	d, err := s.openDir(dir, false)
	if err != nil {
		return nil, s.err("read", key, err)
	}
	defer d.Close()
	fi, err := d.Lstat(name)
	if err != nil {
		return nil, s.err("read", key, err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return nil, s.err("read", key, ErrSymlink)
	}
	if !fi.Mode().IsRegular() {
		return nil, s.err("read", key, fs.ErrNotExist)
	}
	f, err := d.OpenFile(name, os.O_RDONLY|openNoBlock, 0)
	if err != nil {
		return nil, s.err("read", key, err)
	}
	st, err := f.Stat()
	if err == nil && !os.SameFile(fi, st) {
		err = ErrSymlink
	}
	if err == nil && off > st.Size() {
		err = ErrBeyondEnd
	}
	if err == nil {
		_, err = f.Seek(off, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, s.err("read", key, err)
	}
	if n < 0 {
		return f, nil
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(f, n), f}, nil
}

func (s *beneathStore) List(ctx context.Context, prefix string, fn func(Object) error) error {
	if err := checkPrefix(prefix); err != nil {
		return err
	}
	dir := ""
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		dir = prefix[:i]
	}
	d, err := s.openDir(dir, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return s.err("list", prefix, err)
	}
	defer d.Close()
	var objs []Object
	// WalkDir never follows a symbolic link: one is listed as an object
	// (it is something there), never entered.
	err = fs.WalkDir(d.FS(), ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(e.Name(), ".") && p != "." {
			if e.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if e.IsDir() {
			return ctx.Err()
		}
		objs, err = appendObject(objs, path.Join(dir, p), prefix, e)
		return err
	})
	if err != nil {
		return s.err("list", prefix, err)
	}
	return eachByKey(objs, fn)
}

func (s *beneathStore) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	dir, name := path.Split(key)
	d, err := s.openDir(dir, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return s.err("delete", key, err)
	}
	defer d.Close()
	if err := d.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return s.err("delete", key, err)
	}
	return nil
}

func (s *beneathStore) Close() error { return nil }
