package runtime

import (
	"slices"
	"time"
)

// SplitFrontier is implemented by a Source whose subtasks share the splits
// of their input instead of owning them: a Kafka share group hands batches
// of every partition to every subtask, so what one subtask emitted cannot
// tell it what the others have not read yet, and a watermark made from its
// own records passes records nobody has fetched
// (docs/internals/event-time.md, "Watermarks from a share group").
//
// For such a source the runtime keeps one watermark generator per split, as
// Flink does per split, and feeds it the split's frontier: the earliest
// record the whole group has not finished with. Every record still to be
// emitted by any subtask lies at or after its split's frontier, so a
// generator that is right for the split's order (bounded out-of-orderness
// within a partition) is right for the frontier records, a subsequence of
// it. A subtask's watermark is the minimum over the splits that are not
// idle; every subtask reads the same frontier, so every subtask emits the
// same watermark, whatever it was handed. Before the first reading the
// subtask emits no watermark and is never idle.
//
// The task calls both methods on the source's goroutine, around each Poll.
type SplitFrontier[T any] interface {
	// Frontier returns the source's latest reading of its splits'
	// frontiers and the reading's version, which grows with every new
	// reading: the runtime looks at the splits only when it changed.
	// Version 0: nothing read yet (no watermark yet). A negative version:
	// the source gives no frontier, and the subtask's watermark follows its
	// own records (the rule for sources that own their splits).
	Frontier() (version int64, splits []Frontier[T])
	// AlignSplits tells the source which splits' watermarks run more than
	// the strategy's maximum drift (WithWatermarkAlignment) ahead of the
	// subtask's watermark: it stops fetching them until they are no longer
	// ahead (Flink's watermark alignment, FLIP-182). Called when the set
	// changes; nil resumes every split.
	AlignSplits(ahead []string)
}

// Frontier is one split's frontier as a SplitFrontier source read it.
type Frontier[T any] struct {
	// Split names the split (a Kafka partition: "topic/partition").
	Split string
	// Pending reports that the group has not finished every record of the
	// split: Records holds the earliest such record. Not pending: the group
	// has finished them all, and Records holds the split's last records
	// (the largest time among them need not be the last one's).
	Pending bool
	// Records in offset order; none when they could not be read (or
	// decoded): the split's watermark stays where it is.
	Records []FrontierRecord[T]
}

// FrontierRecord is a record at a split's frontier.
type FrontierRecord[T any] struct {
	// Offset orders a split's records: the split's generator sees each
	// record once.
	Offset    int64
	Value     T
	Timestamp int64 // as the source would emit Value (Kafka's timestamp)
}

// frontierState is what a subtask's watermark is, by its splits' frontiers.
type frontierState uint8

const (
	frontierNone    frontierState = iota // the source gives no frontier: its own records rule
	frontierUnknown                      // nothing read yet: no watermark, never idle
	frontierActive                       // the minimum over the splits that are not idle
	frontierIdle                         // every split idle: the largest any reached
)

func (s frontierState) String() string {
	return [...]string{"none", "unknown", "active", "all-idle"}[s]
}

// splitWatermarks is the rule of SplitFrontier as a pure state machine:
// readings and the clock in, the subtask's watermark and the splits to
// pause out (transcripts in runtime/testdata/frontier). A split is idle once
// its frontier has shown it caught up (not pending) for the idleness
// timeout; a pending split is never idle. One task goroutine uses it.
type splitWatermarks[T any] struct {
	newGen   func() WatermarkGenerator[T]
	assign   TimestampAssigner[T]
	idleness time.Duration // 0: a split is never idle
	drift    int64         // ms; 0: no alignment

	version int64
	splits  map[string]*splitWM[T]
	ahead   []string // last reported to the source, sorted
}

// splitWM is one split's generator and what it emitted.
type splitWM[T any] struct {
	gen           WatermarkGenerator[T]
	wm            int64
	offset        int64     // of the last record fed to gen
	fed           bool      // a record was fed
	caughtUpSince time.Time // zero while pending
}

// EmitWatermark, MarkIdle, MarkActive: the split generator's output.
func (s *splitWM[T]) EmitWatermark(ts int64) { s.wm = max(s.wm, ts) }
func (s *splitWM[T]) MarkIdle()              {}
func (s *splitWM[T]) MarkActive()            {}

func newSplitWatermarks[T any](newGen func() WatermarkGenerator[T], assign TimestampAssigner[T], idleness, drift time.Duration) *splitWatermarks[T] {
	return &splitWatermarks[T]{newGen: newGen, assign: assign, idleness: idleness, drift: drift.Milliseconds(),
		splits: map[string]*splitWM[T]{}}
}

// read takes a reading (version > 0) at now: each split's frontier record,
// if new, goes to its generator; a split missing from it is forgotten.
func (m *splitWatermarks[T]) read(now time.Time, version int64, fs []Frontier[T]) {
	if version == m.version {
		return
	}
	m.version = version
	seen := make(map[string]bool, len(fs))
	for _, f := range fs {
		seen[f.Split] = true
		s := m.splits[f.Split]
		if s == nil {
			s = &splitWM[T]{wm: MinWatermark}
			if m.newGen != nil {
				s.gen = m.newGen()
			}
			m.splits[f.Split] = s
		}
		switch {
		case f.Pending:
			s.caughtUpSince = time.Time{}
		case s.caughtUpSince.IsZero():
			s.caughtUpSince = now
		}
		if s.gen == nil {
			continue
		}
		for _, r := range f.Records {
			if s.fed && r.Offset <= s.offset {
				continue
			}
			s.offset, s.fed = r.Offset, true
			ts := r.Timestamp
			if m.assign != nil {
				ts = m.assign(r.Value, ts)
			}
			s.gen.OnEvent(r.Value, ts, s)
		}
		s.gen.OnPeriodicEmit(s)
	}
	for name := range m.splits {
		if !seen[name] {
			delete(m.splits, name)
		}
	}
}

// idle reports whether split s is idle at now.
func (m *splitWatermarks[T]) idle(s *splitWM[T], now time.Time) bool {
	return m.idleness > 0 && !s.caughtUpSince.IsZero() && now.Sub(s.caughtUpSince) >= m.idleness
}

// watermark returns the subtask's watermark at now: the minimum over the
// splits that are not idle (active), or, when every split is idle, the
// largest any reached (nothing waits for an idle split, as the valve does
// for idle channels).
func (m *splitWatermarks[T]) watermark(now time.Time) (int64, frontierState) {
	if m.version == 0 {
		return MinWatermark, frontierUnknown
	}
	lo, hi, active := MaxWatermark, MinWatermark, false
	for _, s := range m.splits {
		hi = max(hi, s.wm)
		if !m.idle(s, now) {
			lo, active = min(lo, s.wm), true
		}
	}
	if !active {
		return hi, frontierIdle
	}
	return lo, frontierActive
}

// alignment returns the splits whose watermark is more than the drift
// ahead of wm, sorted, and whether that set changed since the last call. A
// split stays ahead until it is back within half the drift, so that a
// split near the bound is not paused and resumed at every reading. Idle
// splits are never ahead: they have nothing to fetch, and must be read at
// once when records come. The splits that make wm are never ahead, so the
// group always fetches what holds its watermark back.
func (m *splitWatermarks[T]) alignment(now time.Time, wm int64) ([]string, bool) {
	if m.drift <= 0 {
		return nil, false
	}
	var ahead []string
	if wm > MinWatermark {
		for name, s := range m.splits {
			limit := m.drift
			if slices.Contains(m.ahead, name) {
				limit /= 2
			}
			if !m.idle(s, now) && s.wm-wm > limit {
				ahead = append(ahead, name)
			}
		}
	}
	slices.Sort(ahead)
	if slices.Equal(ahead, m.ahead) {
		return ahead, false
	}
	m.ahead = ahead
	return ahead, true
}
