package storage_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/weirstream/weir/checkpoint/storage"
)

// A store confined Beneath a root never follows a symbolic link below it:
// not to a file outside (a secret), not through a linked directory, not
// when writing (a Put over a link replaces the link, never its target);
// and a directory outside the root is refused before anything is touched.
func TestAStoreBeneathARootFollowsNoSymlinkAndStaysInside(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("top secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	sp := filepath.Join(root, "sp")
	if err := os.MkdirAll(filepath.Join(sp, "state"), 0o755); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		filepath.Join(sp, "_metadata"):          secret,
		filepath.Join(sp, "state", "x.bin"):     secret,
		filepath.Join(sp, "linked"):             outside,
		filepath.Join(root, "linked-sp"):        sp,
		filepath.Join(sp, "state", "inner.bin"): filepath.Join(sp, "state", "real.bin"),
	} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(sp, "state", "real.bin"), []byte("ok"), 0o644); err != nil {
		t.Fatal(err)
	}
	open := func(dir string) storage.Storage {
		t.Helper()
		s, err := storage.Open(t.Context(), "file://"+dir, storage.Beneath(root))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	s := open(sp)
	if b, err := read(t, s, "state/real.bin", 0, -1); err != nil || string(b) != "ok" {
		t.Fatalf("a regular file: %q, %v", b, err)
	}
	for _, key := range []string{"_metadata", "state/x.bin", "linked/secret", "state/inner.bin"} {
		b, err := read(t, s, key, 0, -1)
		if !errors.Is(err, storage.ErrSymlink) || bytes.Contains(b, []byte("top secret")) {
			t.Errorf("read %s: %q, %v; want ErrSymlink", key, b, err)
		}
	}
	if b, err := read(t, open(filepath.Join(root, "linked-sp")), "state/real.bin", 0, -1); !errors.Is(err, storage.ErrSymlink) {
		t.Errorf("through a linked store directory: %q, %v; want ErrSymlink", b, err)
	}
	if err := s.Put(t.Context(), "linked/new", bytes.NewReader([]byte("x"))); !errors.Is(err, storage.ErrSymlink) {
		t.Errorf("write through a linked directory: %v; want ErrSymlink", err)
	}
	if err := s.Create(t.Context(), "_metadata", bytes.NewReader([]byte("x"))); !errors.Is(err, storage.ErrExists) {
		t.Errorf("create over a link: %v; want ErrExists", err)
	}
	if err := s.Put(t.Context(), "state/x.bin", bytes.NewReader([]byte("replaced"))); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "top secret" {
		t.Errorf("a Put over a link wrote its target: %q", b)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 1 {
		t.Errorf("something was written outside the root: %v", entries)
	}
	for _, dir := range []string{outside, filepath.Join(root, ".."), filepath.Join(sp, "..", "..", filepath.Base(outside))} {
		if s, err := storage.Open(t.Context(), "file://"+dir, storage.Beneath(root)); !errors.Is(err, storage.ErrNotBeneath) {
			if err == nil {
				s.Close()
			}
			t.Errorf("open %s: %v; want ErrNotBeneath", dir, err)
		}
	}
	// Nothing is created to read: a missing directory is not found.
	if _, err := read(t, open(filepath.Join(root, "missing")), "_metadata", 0, -1); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("read from a missing directory: %v; want ErrNotFound", err)
	}
	if _, err := os.Stat(filepath.Join(root, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("reading created the directory: %v", err)
	}
}
