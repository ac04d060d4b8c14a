// Package storage owns where checkpoint and savepoint bytes live: object
// stores behind one small interface (Storage), chosen by URL (file://,
// s3://, mem://). Objects are named by slash-separated keys; a key is
// written whole or not at all, and Create writes only if the key is absent,
// which is what makes a checkpoint's metadata write a commit point.
//
// It knows nothing of checkpoints' structure (ids, operators, key groups,
// retention): callers name objects. It must not import runtime, jobmanager or
// taskmanager. Design notes: docs/internals/checkpoint-storage.md.
package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"
)

var (
	// ErrExists is returned by Create when the key already exists.
	ErrExists = errors.New("object already exists")
	// ErrNotFound is returned when a key does not exist.
	ErrNotFound = errors.New("object not found")
	// ErrBadURL is returned by Open for a storage URL it cannot use.
	ErrBadURL = errors.New("bad checkpoint storage URL")
	// ErrBadKey is returned for a key that is not a clean relative path.
	ErrBadKey = errors.New("bad object key")
)

// Storage is an object store. Every method is safe for concurrent use.
type Storage interface {
	// Put writes body as the object key, replacing any object there. Readers
	// see the old object or the new one, never a part.
	Put(ctx context.Context, key string, body io.Reader) error
	// Create writes body as the object key if no object is there, and
	// fails with ErrExists otherwise. Only one of several concurrent Creates
	// of one key succeeds.
	Create(ctx context.Context, key string, body io.Reader) error
	// Open reads n bytes of the object key from offset off; n < 0 reads to
	// the end. A missing key is ErrNotFound.
	Open(ctx context.Context, key string, off, n int64) (io.ReadCloser, error)
	// List calls fn for each object whose key starts with prefix, in
	// lexical key order, and stops at fn's first error, which it returns.
	List(ctx context.Context, prefix string, fn func(Object) error) error
	// Delete removes the object key; a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// Close releases the storage's resources.
	Close() error
}

// Object describes a stored object.
type Object struct {
	Key  string
	Size int64
	// Modified is when the object was last written, by the store's clock
	// (S3's LastModified, a file's modification time): what an orphan
	// sweep's grace period is measured against.
	Modified time.Time
}

// Open returns the storage a URL names:
//
//   - file:///abs/dir: a directory; objects are files below it, written
//     to a temporary file, synced and renamed into place.
//   - s3://bucket/prefix?endpoint=URL&region=R: any S3-compatible store;
//     endpoint and region are optional (AWS's defaults), credentials come
//     the standard AWS way (environment, shared files, instance roles)
//     unless Credentials is given. Path-style addressing is used when an
//     endpoint is given (path-style=false turns it off).
//   - mem://name: in this process's memory, for tests; every Open of
//     mem:// returns a new, empty store.
func Open(ctx context.Context, rawURL string, opts ...Opt) (Storage, error) {
	cfg := defaultCfg()
	for _, o := range opts {
		o.apply(&cfg)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrBadURL, rawURL, err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, fmt.Errorf("%w %q: a file URL names a local directory (file:///abs/dir)", ErrBadURL, rawURL)
		}
		if u.Path == "" || !strings.HasPrefix(u.Path, "/") {
			return nil, fmt.Errorf("%w %q: the directory must be an absolute path (file:///abs/dir)", ErrBadURL, rawURL)
		}
		if cfg.beneath != "" {
			return openBeneath(cfg.beneath, u.Path)
		}
		return openFile(u.Path)
	case "mem":
		return newMem(), nil
	case "s3":
		return openS3(ctx, u, cfg)
	case "":
		return nil, fmt.Errorf("%w %q: no scheme; use file:///abs/dir, s3://bucket/prefix or mem://", ErrBadURL, rawURL)
	default:
		return nil, fmt.Errorf("%w %q: unknown scheme %q; use file, s3 or mem", ErrBadURL, rawURL, u.Scheme)
	}
}

// ErrBeyondEnd is returned (wrapped) by Open when the offset is past the
// object's end.
var ErrBeyondEnd = fmt.Errorf("offset beyond the object's end: %w", io.ErrUnexpectedEOF)

// checkKey enforces the one key rule every store shares: a relative,
// slash-separated path of non-empty segments, none starting with "." (which
// the file store keeps for its temporary files), without backslashes.
func checkKey(key string) error {
	if key == "" || strings.HasPrefix(key, "/") || strings.Contains(key, "\\") {
		return fmt.Errorf("%w %q", ErrBadKey, key)
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "" || strings.HasPrefix(seg, ".") {
			return fmt.Errorf("%w %q", ErrBadKey, key)
		}
	}
	return nil
}

// checkPrefix allows the empty prefix and prefixes ending in "/".
func checkPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	return checkKey(strings.TrimSuffix(prefix, "/"))
}
