package storage_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/s3server"
)

// stores opens one store of every kind for a test: a directory (also one
// confined Beneath a root), memory, and a bucket of the embedded S3 server
// through the real AWS client.
func stores(t *testing.T) map[string]storage.Storage {
	t.Helper()
	srv, err := s3server.Start(t.Context(), s3server.Buckets("weir"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	root := t.TempDir()
	urls := map[string]string{
		"file":         "file://" + t.TempDir(),
		"file-beneath": "file://" + filepath.Join(root, "a", "b"),
		"mem":          "mem://",
		"s3":           srv.URL("weir", "cluster-a/checkpoints"),
	}
	out := map[string]storage.Storage{}
	for name, u := range urls {
		opts := []storage.Opt{storage.Credentials("weir", "weir")}
		if name == "file-beneath" {
			opts = append(opts, storage.Beneath(root))
		}
		s, err := storage.Open(t.Context(), u, opts...)
		if err != nil {
			t.Fatalf("open %s: %v", u, err)
		}
		t.Cleanup(func() { s.Close() })
		out[name] = s
	}
	return out
}

func read(t *testing.T, s storage.Storage, key string, off, n int64) ([]byte, error) {
	t.Helper()
	r, err := s.Open(t.Context(), key, off, n)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

func list(t *testing.T, s storage.Storage, prefix string) []storage.Object {
	t.Helper()
	var objs []storage.Object
	if err := s.List(t.Context(), prefix, func(o storage.Object) error { objs = append(objs, o); return nil }); err != nil {
		t.Fatalf("list %q: %v", prefix, err)
	}
	return objs
}

func TestEveryStoreKeepsWhatItWasGivenAndNamesWhatIsMissing(t *testing.T) {
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			put := map[string]string{
				"job-1/chk-1/_metadata":  "meta one",
				"job-1/chk-2/_metadata":  "meta two",
				"job-1/shared/seg-0001":  "0123456789",
				"job-1-other/_metadata":  "not under job-1/",
				"job-2/chk-10/task-0-kg": "",
			}
			for k, v := range put {
				if err := s.Put(ctx, k, strings.NewReader(v)); err != nil {
					t.Fatalf("put %s: %v", k, err)
				}
			}
			for k, v := range put {
				if got, err := read(t, s, k, 0, -1); err != nil || string(got) != v {
					t.Errorf("read %s = %q, %v; want %q", k, got, err, v)
				}
			}
			// Ranges, as segments of shared files are read.
			for _, c := range []struct {
				off, n int64
				want   string
			}{{0, 4, "0123"}, {3, 4, "3456"}, {7, -1, "789"}, {8, 100, "89"}, {10, -1, ""}, {4, 0, ""}} {
				if got, err := read(t, s, "job-1/shared/seg-0001", c.off, c.n); err != nil || string(got) != c.want {
					t.Errorf("read at %d for %d = %q, %v; want %q", c.off, c.n, got, err, c.want)
				}
			}
			if _, err := read(t, s, "job-1/shared/seg-0001", 11, 2); !errors.Is(err, storage.ErrBeyondEnd) {
				t.Errorf("read past the end: %v, want ErrBeyondEnd", err)
			}
			// Put replaces.
			if err := s.Put(ctx, "job-1/chk-1/_metadata", strings.NewReader("replaced")); err != nil {
				t.Fatal(err)
			}
			if got, _ := read(t, s, "job-1/chk-1/_metadata", 0, -1); string(got) != "replaced" {
				t.Errorf("after a second put: %q", got)
			}
			// Create does not.
			err := s.Create(ctx, "job-1/chk-2/_metadata", strings.NewReader("a deposed writer"))
			if !errors.Is(err, storage.ErrExists) {
				t.Errorf("create over an existing key: %v, want ErrExists", err)
			}
			if got, _ := read(t, s, "job-1/chk-2/_metadata", 0, -1); string(got) != "meta two" {
				t.Errorf("a refused create changed the object: %q", got)
			}
			if err := s.Create(ctx, "job-1/chk-3/_metadata", strings.NewReader("meta three")); err != nil {
				t.Errorf("create of a new key: %v", err)
			}
			// List: under a prefix, in key order, with sizes.
			got := list(t, s, "job-1/")
			for i, o := range got {
				if o.Modified.IsZero() {
					t.Errorf("list job-1/: %s has no modification time", o.Key)
				}
				got[i].Modified = time.Time{}
			}
			want := []storage.Object{
				{Key: "job-1/chk-1/_metadata", Size: 8}, {Key: "job-1/chk-2/_metadata", Size: 8},
				{Key: "job-1/chk-3/_metadata", Size: 10}, {Key: "job-1/shared/seg-0001", Size: 10},
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("list job-1/ = %v, want %v", got, want)
			}
			if got := list(t, s, "job-1/chk-"); len(got) != 3 {
				t.Errorf("list job-1/chk- = %v, want the three checkpoints", got)
			}
			if got := list(t, s, ""); len(got) != 6 {
				t.Errorf("list of everything = %v, want 6 objects", got)
			}
			if got := list(t, s, "nothing-here/"); len(got) != 0 {
				t.Errorf("list of an empty prefix = %v", got)
			}
			// Delete, twice.
			for range 2 {
				if err := s.Delete(ctx, "job-1/chk-1/_metadata"); err != nil {
					t.Errorf("delete: %v", err)
				}
			}
			if _, err := read(t, s, "job-1/chk-1/_metadata", 0, -1); !errors.Is(err, storage.ErrNotFound) {
				t.Errorf("read of a deleted key: %v, want ErrNotFound", err)
			}
			if _, err := read(t, s, "job-1/chk-1/_metadata", 0, 0); !errors.Is(err, storage.ErrNotFound) {
				t.Errorf("empty read of a deleted key: %v, want ErrNotFound", err)
			}
			if got := list(t, s, "job-1/chk-1/"); len(got) != 0 {
				t.Errorf("deleted key still listed: %v", got)
			}
		})
	}
}

func TestEveryStoreRefusesKeysThatAreNotCleanRelativePaths(t *testing.T) {
	for name, s := range stores(t) {
		for _, key := range []string{"", "/abs", "a//b", "a/../b", "..", "a/./b", "a/.hidden", `a\b`, "trailing/"} {
			t.Run(name+"/"+key, func(t *testing.T) {
				if err := s.Put(t.Context(), key, strings.NewReader("x")); !errors.Is(err, storage.ErrBadKey) {
					t.Errorf("put %q: %v, want ErrBadKey", key, err)
				}
				if _, err := s.Open(t.Context(), key, 0, -1); !errors.Is(err, storage.ErrBadKey) {
					t.Errorf("open %q: %v, want ErrBadKey", key, err)
				}
			})
		}
	}
}

func TestOnlyOneOfConcurrentCreatesOfAKeyWins(t *testing.T) {
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			const writers = 8
			var wg sync.WaitGroup
			errs := make([]error, writers)
			for i := range writers {
				wg.Go(func() {
					errs[i] = s.Create(t.Context(), "job/chk-7/_metadata", strings.NewReader(fmt.Sprintf("writer %d", i)))
				})
			}
			wg.Wait()
			won := -1
			for i, err := range errs {
				switch {
				case err == nil && won >= 0:
					t.Fatalf("writers %d and %d both created the key", won, i)
				case err == nil:
					won = i
				case !errors.Is(err, storage.ErrExists):
					t.Fatalf("writer %d: %v", i, err)
				}
			}
			if won < 0 {
				t.Fatal("no writer created the key")
			}
			if got, _ := read(t, s, "job/chk-7/_metadata", 0, -1); string(got) != fmt.Sprintf("writer %d", won) {
				t.Errorf("the key holds %q, not the winner's (writer %d)", got, won)
			}
		})
	}
}

// TestLargeObjectsGoUpInPartsAndComeBackWhole writes 24 MiB through the real
// AWS client to the embedded server in 5 MiB parts (a multipart upload of 5
// parts, the last a short one) and reads it back whole and by ranges that
// cross part boundaries.
func TestLargeObjectsGoUpInPartsAndComeBackWhole(t *testing.T) {
	srv, err := s3server.Start(t.Context(), s3server.Buckets("weir"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	s, err := storage.Open(t.Context(), srv.URL("weir", "big"), storage.Credentials("weir", "weir"), storage.PartSize(5<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	data := make([]byte, 24<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	if err := s.Put(t.Context(), "job/shared/segment", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	got, err := read(t, s, "job/shared/segment", 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != sha256.Sum256(data) {
		t.Fatalf("read back %d bytes that differ from the %d written", len(got), len(data))
	}
	for _, off := range []int64{5<<20 - 3, 10 << 20, 24<<20 - 10} {
		got, err := read(t, s, "job/shared/segment", off, 10)
		if err != nil || !bytes.Equal(got, data[off:off+10]) {
			t.Errorf("range at %d: %x, %v; want %x", off, got, err, data[off:off+10])
		}
	}
	if objs := list(t, s, "job/"); len(objs) != 1 || objs[0].Size != int64(len(data)) {
		t.Errorf("list = %v, want one object of %d bytes", objs, len(data))
	}
}

// failingReader fails after n bytes, like a task's state stream that breaks.
type failingReader struct{ n int }

var errBroken = errors.New("state stream broke")

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, errBroken
	}
	k := min(len(p), r.n)
	clear(p[:k])
	r.n -= k
	return k, nil
}

func TestAWriteThatFailsHalfwayLeavesNoObject(t *testing.T) {
	srv, err := s3server.Start(t.Context(), s3server.Buckets("weir"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	all := stores(t)
	big, err := storage.Open(t.Context(), srv.URL("weir", "p"), storage.Credentials("weir", "weir"), storage.PartSize(5<<20))
	if err != nil {
		t.Fatal(err)
	}
	all["s3 multipart"] = big
	for name, s := range all {
		t.Run(name, func(t *testing.T) {
			err := s.Put(t.Context(), "job/chk-1/state", &failingReader{n: 12 << 20})
			if !errors.Is(err, errBroken) {
				t.Fatalf("put from a broken stream: %v, want the stream's error", err)
			}
			if objs := list(t, s, ""); len(objs) != 0 {
				t.Errorf("a failed write left %v", objs)
			}
		})
	}
}

func TestOpenRefusesBadURLsWithTheReason(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"", "no scheme"},
		{"/var/lib/weir", "no scheme"},
		{"ftp://host/dir", `unknown scheme "ftp"`},
		{"file://host/dir", "local directory"},
		{"file:relative/dir", "absolute path"},
		{"s3:///prefix", "no bucket"},
		{"s3://bucket/p?endpiont=http://x", `unknown parameter "endpiont"`},
		{"s3://bucket/p?endpoint=localhost:9000", "not an http(s) URL"},
		{"s3://bucket/p?path-style=yes", `path-style="yes"`},
		{"s3://bucket/a/../b", "prefix"},
	} {
		t.Run(c.url, func(t *testing.T) {
			s, err := storage.Open(t.Context(), c.url)
			if err == nil {
				s.Close()
				t.Fatalf("open %q succeeded", c.url)
			}
			if !errors.Is(err, storage.ErrBadURL) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("open %q: %v; want ErrBadURL saying %q", c.url, err, c.want)
			}
		})
	}
}

func TestAnUnreachableEndpointIsAnErrorNotAHang(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	s, err := storage.Open(t.Context(), "s3://weir/x?endpoint=http://"+addr, storage.Credentials("weir", "weir"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	err = s.Put(ctx, "job/chk-1/_metadata", strings.NewReader("x"))
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "job/chk-1/_metadata") {
		t.Errorf("put to an unreachable store: %v; want a connection error naming the key", err)
	}
}
