package runtime

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestRestartPolicyDecide(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(secs ...float64) []time.Time {
		out := make([]time.Time, len(secs))
		for i, s := range secs {
			out[i] = t0.Add(time.Duration(s * float64(time.Second)))
		}
		return out
	}
	exp := ExponentialDelayRestart(InitialBackoff(time.Second), MaxBackoff(10*time.Second), BackoffMultiplier(2),
		ResetBackoffThreshold(time.Minute), Jitter(0))
	tests := []struct {
		name     string
		p        RestartPolicy
		failures []time.Time
		u        float64
		restart  bool
		delay    time.Duration
		reason   string
	}{
		{"fixed first", FixedDelayRestart(2, time.Second), at(0), 0, true, time.Second, ""},
		{"fixed last attempt", FixedDelayRestart(2, time.Second), at(0, 1), 0, true, time.Second, ""},
		{"fixed exhausted", FixedDelayRestart(2, time.Second), at(0, 1, 2), 0, false, 0, "3 failures exceed fixed-delay's 2"},
		{"fixed zero attempts", FixedDelayRestart(0, 0), at(0), 0, false, 0, "exceed fixed-delay's 0"},
		{"none", NoRestart(), at(0), 0, false, 0, "none"},
		{"rate under", FailureRateRestart(2, time.Minute, 3*time.Second), at(0, 10), 0, true, 3 * time.Second, ""},
		{"rate over", FailureRateRestart(2, time.Minute, 3*time.Second), at(0, 10, 20), 0, false, 0, "3 failures within 1m0s exceed failure-rate's 2"},
		{"rate old failures age out", FailureRateRestart(2, time.Minute, 3*time.Second), at(0, 10, 70, 75), 0, true, 3 * time.Second, ""},
		{"rate interval edge excluded", FailureRateRestart(1, time.Minute, 0), at(0, 60), 0, true, 0, ""},
		{"exp first", exp, at(0), 0.5, true, time.Second, ""},
		{"exp grows", exp, at(0, 1, 2), 0.5, true, 4 * time.Second, ""},
		{"exp capped", exp, at(0, 1, 2, 3, 4, 5, 6), 0.5, true, 10 * time.Second, ""},
		{"exp resets after a long run", exp, at(0, 1, 2, 100), 0.5, true, time.Second, ""},
		{"exp grows again after reset", exp, at(0, 1, 2, 100, 101), 0.5, true, 2 * time.Second, ""},
		{"exp jitter low", ExponentialDelayRestart(InitialBackoff(time.Second), Jitter(0.1)), at(0), 0, true, 900 * time.Millisecond, ""},
		{"exp jitter high", ExponentialDelayRestart(InitialBackoff(time.Second), Jitter(0.1)), at(0), 1, true, 1100 * time.Millisecond, ""},
		{"exp jitter never above max", ExponentialDelayRestart(InitialBackoff(time.Second), MaxBackoff(time.Second), Jitter(0.5)), at(0), 1, true, time.Second, ""},
		{"exp unlimited", exp, at(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), 0.5, true, 10 * time.Second, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.p.Decide(tt.failures, tt.u)
			if d.Restart != tt.restart || d.Delay != tt.delay || !strings.Contains(d.Reason, tt.reason) || d.Attempt != len(tt.failures) {
				t.Fatalf("%s.Decide = %+v, want restart %v after %v, reason %q, attempt %d",
					tt.p, d, tt.restart, tt.delay, tt.reason, len(tt.failures))
			}
			if again := tt.p.Decide(tt.failures, tt.u); again != d {
				t.Fatalf("not deterministic: %+v then %+v", d, again)
			}
		})
	}
}

func TestParseRestartStrategy(t *testing.T) {
	tests := []struct {
		spec string
		want string // String() of the result; "" for an error
		err  string
	}{
		{"none", "none", ""},
		{"fixed-delay", "fixed-delay:attempts=3,delay=1s", ""},
		{"fixed-delay:attempts=5,delay=200ms", "fixed-delay:attempts=5,delay=200ms", ""},
		{"failure-rate:max-failures=3,interval=5m,delay=2s", "failure-rate:max-failures=3,interval=5m0s,delay=2s", ""},
		{"exponential-delay", "exponential-delay:initial-backoff=1s,max-backoff=1m0s,multiplier=1.5,reset-backoff-threshold=1h0m0s,jitter=0.1", ""},
		{"exponential-delay:initial-backoff=100ms,max-backoff=2s,multiplier=2,reset-backoff-threshold=10m,jitter=0",
			"exponential-delay:initial-backoff=100ms,max-backoff=2s,multiplier=2,reset-backoff-threshold=10m0s,jitter=0", ""},
		{"fixed", "", `restart strategy "fixed": want none, fixed-delay`},
		{"fixed-delay:tries=3", "", `"tries=3" is not one of fixed-delay's keys`},
		{"fixed-delay:attempts=x", "", "attempts: strconv.Atoi"},
		{"fixed-delay:attempts=-1", "", "must not be negative"},
		{"exponential-delay:multiplier=0.5", "", "multiplier 0.5 must be at least 1"},
		{"exponential-delay:initial-backoff=2m", "", "at most max-backoff"},
		{"failure-rate:interval=0s", "", "interval 0s must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			p, err := ParseRestartStrategy(tt.spec)
			if tt.err != "" {
				if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseRestartStrategy(%q) = %v, want ErrInvalidOption with %q", tt.spec, err, tt.err)
				}
				return
			}
			if err != nil || p.String() != tt.want {
				t.Fatalf("ParseRestartStrategy(%q) = %s, %v; want %s", tt.spec, p, err, tt.want)
			}
		})
	}
}

// The mini cluster follows the policy: failure-rate fails the job once the
// failures within the interval exceed the maximum, and says why.
func TestMiniClusterFailsWhenTheFailureRateIsExceeded(t *testing.T) {
	_, err := NewMiniCluster(RestartStrategy(FailureRateRestart(2, time.Minute, time.Millisecond)),
		CheckpointInterval(10*time.Millisecond)).Run(t.Context(), failingJob(t))
	if !errors.Is(err, ErrJobFailed) || !strings.Contains(err.Error(), "after 2 restarts (3 failures within 1m0s exceed failure-rate's 2)") {
		t.Fatalf("Run = %v, want ErrJobFailed after 2 restarts naming failure-rate", err)
	}
}

// openFailingSource fails every attempt at Open.
type openFailingSource struct{ Source[seqRec] }

func (openFailingSource) Open(context.Context, *OperatorContext) error {
	return errors.New("source down")
}

func failingJob(t *testing.T) *Job {
	t.Helper()
	txns := newMemTxns()
	src := func() Source[seqRec] {
		return openFailingSource{seqSourceOf(seqSource{keys: 1, splits: 1, n: 1, perPoll: 1})()}
	}
	return seqJobTo(src, &violations{}, func() Sink[seqRec] { return &txnSink{txns: txns} }, 1, 1)
}

// failOnceSource fails its first attempt's first Poll.
type failOnceSource struct {
	Source[seqRec]
	attempt int
}

func (s *failOnceSource) Open(ctx context.Context, oc *OperatorContext) error {
	s.attempt = oc.Attempt
	return s.Source.Open(ctx, oc)
}

func (s *failOnceSource) Poll(ctx context.Context, out Collector[seqRec]) error {
	if s.attempt == 0 {
		return errors.New("injected failure")
	}
	return s.Source.Poll(ctx, out)
}

// slowCloseSink takes closeFor to close in the first attempt: a task that
// is slow to cancel, as a share-group source waiting for its fetch.
type slowCloseSink struct {
	txnSink
	closeFor time.Duration
	attempt  int
}

func (s *slowCloseSink) Open(ctx context.Context, oc *OperatorContext) error {
	s.attempt = oc.Attempt
	return s.txnSink.Open(ctx, oc)
}

func (s *slowCloseSink) Close() error {
	if s.attempt == 0 {
		time.Sleep(s.closeFor)
	}
	return s.txnSink.Close()
}

// The restart strategy's delay counts from the failure, as Flink's
// scheduler counts it: the failed attempt's other tasks are cancelled
// during the delay, not before it starts. Here they take closeFor to stop,
// and the next attempt is planned for the failure plus the delay, before
// the attempt's end (when OnRestart is called) plus the delay.
func TestTheRestartDelayCountsFromTheFailureNotFromTheEndOfTheCancel(t *testing.T) {
	const delay, closeFor = 500 * time.Millisecond, 300 * time.Millisecond
	txns := newMemTxns()
	src := func() Source[seqRec] {
		return &failOnceSource{Source: seqSourceOf(seqSource{keys: 4, splits: 1, n: 5, perPoll: 1})()}
	}
	job := seqJobTo(src, &violations{}, func() Sink[seqRec] {
		return &slowCloseSink{txnSink: txnSink{txns: txns}, closeFor: closeFor}
	}, 1, 1)
	var ended, next time.Time
	_, err := NewMiniCluster(RestartStrategy(FixedDelayRestart(1, delay)), CheckpointInterval(10*time.Millisecond),
		OnRestart(func(int, error) { ended = time.Now() }),
		OnNextAttempt(func(at time.Time) { next = at })).Run(t.Context(), job)
	if err != nil {
		t.Fatalf("Run = %v, want the job to finish after one restart", err)
	}
	if ended.IsZero() || next.IsZero() {
		t.Fatalf("no restart: attempt ended %v, next attempt at %v", ended, next)
	}
	if !next.Before(ended.Add(delay)) {
		t.Errorf("next attempt at %v, %v after the failed attempt ended: want the delay (%v) counted from the failure, "+
			"which came at least %v (the sink's close) before the attempt ended", next.Format(time.StampMicro), next.Sub(ended), delay, closeFor)
	}
}
