// Package failpoint owns Weir's fault-injection points: named places in the
// code (a source after writing its ack marker, a sink after pre-committing, the
// job manager after persisting a checkpoint, ...) where a test or an operator
// can make the process crash, fail or stall, to prove that exactly-once holds
// across the failure.
//
// Failpoints are configured with the environment variable WEIR_FAILPOINTS,
//
//	WEIR_FAILPOINTS="name=action[,name=action...]"
//
// with the actions
//
//	crash       SIGKILL the process at once, without any cleanup
//	crash@N     SIGKILL on the N-th hit of the point (hits count from 1)
//	error       Inject returns an error wrapping ErrInjected
//	sleep(MS)   Inject sleeps MS milliseconds, then returns nil
//
// Any action may carry @N to fire only on the N-th hit ("error@3").
// In-process tests that cannot afford to kill the test binary use hooks
// (WithHook) instead: a function run on every hit whose error Inject returns.
//
// The package must not hold mutable package-level state other than the
// environment-derived Default set, which is parsed once and is read-only
// after that; it must not do anything when no failpoint is configured beyond
// a nil check and a length check, so points can stay in hot paths
// (task.process runs per record).
package failpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Names of the failpoints of the Weir contract (docs/architecture.md,
// "Failpoints"). Known lists them; Parse accepts no other name.
const (
	// SourceAfterAckPrecommit fires after the source wrote its ack marker into
	// the checkpoint's transaction, before it acks the checkpoint.
	SourceAfterAckPrecommit = "source.after-ack-precommit"
	// SinkAfterPrecommit fires after a sink flushed and pre-committed, before
	// it acks the checkpoint.
	SinkAfterPrecommit = "sink.after-precommit"
	// JMAfterCheckpointPersisted fires after the completed checkpoint was
	// synced to pebble, before any notification is sent.
	JMAfterCheckpointPersisted = "jm.after-checkpoint-persisted"
	// SinkAfterCommit fires after a sink's EndTxn commit returned, before the
	// task finishes handling the notification.
	SinkAfterCommit = "sink.after-commit"
	// SourceAfterAckCommit fires after the ack-log transaction committed,
	// before the broker ACCEPT.
	SourceAfterAckCommit = "source.after-ack-commit"
	// TaskProcess fires for each record processed by any operator.
	TaskProcess = "task.process"
)

// Point describes one failpoint of the contract.
type Point struct {
	Name  string
	Where string // where in the code it fires
}

// Known returns the failpoints the code fires, in contract order: the only
// names Parse accepts. It returns a new slice on every call.
func Known() []Point {
	return []Point{
		{SourceAfterAckPrecommit, "ack marker written into the checkpoint's transaction, before the source acks the checkpoint"},
		{SinkAfterPrecommit, "sink flushed and pre-committed, before it acks the checkpoint"},
		{JMAfterCheckpointPersisted, "completed checkpoint synced to pebble, before any notification is sent"},
		{SinkAfterCommit, "sink's EndTxn commit returned, before the task finishes handling notify"},
		{SourceAfterAckCommit, "ack-log transaction committed, before the broker ACCEPT"},
		{TaskProcess, "each record processed by any operator"},
	}
}

// knownName reports whether name is in Known, or an error listing them.
func knownName(name string) error {
	var names []string
	for _, p := range Known() {
		if p.Name == name {
			return nil
		}
		names = append(names, p.Name)
	}
	return fmt.Errorf("unknown failpoint %q (known: %s)", name, strings.Join(names, ", "))
}

// EnvVar is the environment variable FromEnv and Default read.
const EnvVar = "WEIR_FAILPOINTS"

// ErrInjected is wrapped by every error an "error" action returns.
var ErrInjected = errors.New("injected error")

// ErrBadSpec is wrapped by Parse errors.
var ErrBadSpec = errors.New("bad spec")

type kind uint8

const (
	kindCrash kind = iota + 1
	kindError
	kindSleep
	kindHook
)

type point struct {
	name  string
	kind  kind
	nth   int64 // fire only on this hit; 0 = every hit
	sleep time.Duration
	hook  func() error
	hits  atomic.Int64
}

// Set is an immutable set of configured failpoints with per-point hit
// counters. A nil *Set is valid and injects nothing. A Set is safe for
// concurrent use.
type Set struct {
	points map[string]*point
	// kill ends the process for crash actions; replaced only in tests of
	// this package.
	kill func()
}

// Option configures a Set built by New or Parse.
type Option interface{ apply(*Set) }

// option is a Option from a function.
type option func(*Set)

func (o option) apply(c *Set) { o(c) }

// WithHook makes the point name run fn on every hit; Inject returns fn's
// error (wrapped so that it names the point, and still matchable with
// errors.Is). Use it in in-process tests to simulate a crash, e.g. by
// returning a sentinel error or cancelling a context. A hook replaces any
// action parsed for the same name.
func WithHook(name string, fn func() error) Option {
	return option(func(s *Set) {
		if fn == nil {
			return
		}
		s.points[name] = &point{name: name, kind: kindHook, hook: fn}
	})
}

// New returns a Set with only the given options (typically hooks).
func New(opts ...Option) *Set {
	s := &Set{points: make(map[string]*point), kill: killSelf}
	for _, o := range opts {
		o.apply(s)
	}
	return s
}

// Parse parses a WEIR_FAILPOINTS spec ("name=action[,name=action...]").
// An empty spec gives an empty Set. A name not in Known, an unknown action or
// a malformed entry is an error wrapping ErrBadSpec that quotes the entry. Options are applied after parsing.
func Parse(spec string, opts ...Option) (*Set, error) {
	s := New()
	for _, entry := range strings.Split(spec, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		p, err := parseEntry(entry)
		if err != nil {
			return nil, err
		}
		if _, dup := s.points[p.name]; dup {
			return nil, fmt.Errorf("%w: %q: failpoint %q configured twice", ErrBadSpec, spec, p.name)
		}
		s.points[p.name] = p
	}
	for _, o := range opts {
		o.apply(s)
	}
	return s, nil
}

func parseEntry(entry string) (*point, error) {
	name, action, ok := strings.Cut(entry, "=")
	name, action = strings.TrimSpace(name), strings.TrimSpace(action)
	if !ok || action == "" {
		return nil, fmt.Errorf("%w: %q: want name=action", ErrBadSpec, entry)
	}
	if err := validName(name); err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrBadSpec, entry, err)
	}
	if err := knownName(name); err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrBadSpec, entry, err)
	}
	p := &point{name: name}
	if base, n, has := strings.Cut(action, "@"); has {
		nth, err := strconv.ParseInt(strings.TrimSpace(n), 10, 64)
		if err != nil || nth < 1 {
			return nil, fmt.Errorf("%w: %q: @N needs an integer N >= 1, got %q", ErrBadSpec, entry, n)
		}
		p.nth = nth
		action = strings.TrimSpace(base)
	}
	switch {
	case action == "crash":
		p.kind = kindCrash
	case action == "error":
		p.kind = kindError
	case strings.HasPrefix(action, "sleep(") && strings.HasSuffix(action, ")"):
		ms, err := strconv.ParseInt(strings.TrimSpace(action[len("sleep("):len(action)-1]), 10, 64)
		if err != nil || ms < 0 {
			return nil, fmt.Errorf("%w: %q: sleep needs milliseconds >= 0", ErrBadSpec, entry)
		}
		p.kind = kindSleep
		p.sleep = time.Duration(ms) * time.Millisecond
	default:
		return nil, fmt.Errorf("%w: %q: unknown action %q (want crash, crash@N, error or sleep(MS))", ErrBadSpec, entry, action)
	}
	return p, nil
}

func validName(name string) error {
	if name == "" {
		return errors.New("empty failpoint name")
	}
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
		default:
			return fmt.Errorf("failpoint name %q has illegal character %q", name, r)
		}
	}
	return nil
}

// FromEnv parses the WEIR_FAILPOINTS environment variable. An unset or empty
// variable gives an empty Set. An error starts with the variable and its
// value as the user wrote it (WEIR_FAILPOINTS="...": ...).
func FromEnv(opts ...Option) (*Set, error) {
	spec := os.Getenv(EnvVar)
	s, err := Parse(spec, opts...)
	if err != nil {
		return nil, fmt.Errorf("%s=%q: %w", EnvVar, spec, err)
	}
	return s, nil
}

// defaultSet is the process-wide Set parsed from the environment; it is
// written once under defaultOnce and read-only after that.
var (
	defaultOnce sync.Once
	defaultSet  *Set
	defaultErr  error
)

// Default returns the process-wide Set parsed from WEIR_FAILPOINTS on the
// first call. The result (and the error, if the spec was bad) is fixed for
// the life of the process: later changes of the environment are not seen.
// Binaries should call it once at start-up and fail on error.
func Default() (*Set, error) {
	defaultOnce.Do(func() { defaultSet, defaultErr = FromEnv() })
	return defaultSet, defaultErr
}

// Enabled reports whether any failpoint is configured.
func (s *Set) Enabled() bool { return s != nil && len(s.points) > 0 }

// Names returns the configured failpoint names in no particular order.
func (s *Set) Names() []string {
	if s == nil {
		return nil
	}
	names := make([]string, 0, len(s.points))
	for n := range s.points {
		names = append(names, n)
	}
	return names
}

// Hits returns how many times the point name was reached since the Set was
// built (only configured points are counted).
func (s *Set) Hits(name string) int64 {
	if s == nil {
		return 0
	}
	if p, ok := s.points[name]; ok {
		return p.hits.Load()
	}
	return 0
}

// Inject runs the action configured for name, if any: it kills the process
// (crash), returns an error wrapping ErrInjected (error), sleeps (sleep) or
// runs the hook. It returns nil for unconfigured points, for a nil Set, and
// for hits other than N with @N.
func (s *Set) Inject(name string) error {
	if s == nil || len(s.points) == 0 {
		return nil
	}
	return s.inject(context.Background(), name)
}

// InjectContext is Inject whose sleep action stops early, returning the
// context's error, when ctx is done.
func (s *Set) InjectContext(ctx context.Context, name string) error {
	if s == nil || len(s.points) == 0 {
		return nil
	}
	return s.inject(ctx, name)
}

func (s *Set) inject(ctx context.Context, name string) error {
	p, ok := s.points[name]
	if !ok {
		return nil
	}
	hit := p.hits.Add(1)
	if p.nth != 0 && hit != p.nth {
		return nil
	}
	switch p.kind {
	case kindCrash:
		fmt.Fprintf(os.Stderr, "weir: failpoint %s: crash (hit %d)\n", name, hit)
		s.kill()
		// Not reached on unix; if the kill was somehow survived, fail the
		// caller rather than carry on as if nothing happened.
		return fmt.Errorf("failpoint %s: crash: %w", name, ErrInjected)
	case kindError:
		return fmt.Errorf("failpoint %s (hit %d): %w", name, hit, ErrInjected)
	case kindSleep:
		t := time.NewTimer(p.sleep)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("failpoint %s: sleep: %w", name, ctx.Err())
		}
	case kindHook:
		if err := p.hook(); err != nil {
			return fmt.Errorf("failpoint %s (hit %d): %w", name, hit, err)
		}
	}
	return nil
}
