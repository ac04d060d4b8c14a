package storage

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"
)

// memStore keeps objects in memory, for tests.
type memStore struct {
	mu   sync.Mutex
	objs map[string]memObject
}

type memObject struct {
	b        []byte
	modified time.Time
}

func newMem() *memStore { return &memStore{objs: map[string]memObject{}} }

func (s *memStore) put(key string, body io.Reader, create bool) error {
	if err := checkKey(key); err != nil {
		return err
	}
	b, err := io.ReadAll(body)
	if err != nil {
		return fmt.Errorf("write %s: %w", key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.objs[key]; ok && create {
		return fmt.Errorf("create %s: %w", key, ErrExists)
	}
	s.objs[key] = memObject{b, time.Now()}
	return nil
}

func (s *memStore) Put(ctx context.Context, key string, body io.Reader) error {
	return s.put(key, body, false)
}

func (s *memStore) Create(ctx context.Context, key string, body io.Reader) error {
	return s.put(key, body, true)
}

func (s *memStore) Open(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	s.mu.Lock()
	o, ok := s.objs[key]
	s.mu.Unlock()
	b := o.b
	if !ok {
		return nil, fmt.Errorf("read %s: %w", key, ErrNotFound)
	}
	if off > int64(len(b)) {
		return nil, fmt.Errorf("read %s at %d: %w", key, off, ErrBeyondEnd)
	}
	b = b[off:]
	if n >= 0 && n < int64(len(b)) {
		b = b[:n]
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (s *memStore) List(ctx context.Context, prefix string, fn func(Object) error) error {
	if err := checkPrefix(prefix); err != nil {
		return err
	}
	s.mu.Lock()
	var objs []Object
	for k, o := range s.objs {
		if strings.HasPrefix(k, prefix) {
			objs = append(objs, Object{Key: k, Size: int64(len(o.b)), Modified: o.modified})
		}
	}
	s.mu.Unlock()
	sort.Slice(objs, func(i, j int) bool { return objs[i].Key < objs[j].Key })
	for _, o := range objs {
		if err := fn(o); err != nil {
			return err
		}
	}
	return nil
}

func (s *memStore) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.objs, key)
	s.mu.Unlock()
	return nil
}

func (s *memStore) Close() error { return nil }
