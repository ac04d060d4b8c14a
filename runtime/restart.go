package runtime

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Restart strategy names, as Flink's restart-strategy.type.
const (
	StrategyFixedDelay       = "fixed-delay"
	StrategyExponentialDelay = "exponential-delay"
	StrategyFailureRate      = "failure-rate"
	StrategyNone             = "none"
)

// RestartPolicy decides whether a failed job restarts and after how long,
// with Flink's restart strategies and their semantics. It is a value: Decide
// is pure and deterministic, so a job manager and the mini cluster use the
// same decisions. Build one with FixedDelayRestart, ExponentialDelayRestart,
// FailureRateRestart, NoRestart or ParseRestartStrategy.
type RestartPolicy struct {
	name string
	// fixed-delay
	attempts int
	// fixed-delay, failure-rate
	delay time.Duration
	// exponential-delay
	initial, max, reset time.Duration
	multiplier, jitter  float64
	// failure-rate
	maxFailures int
	interval    time.Duration
}

// FixedDelayRestart restarts the job at most attempts times, waiting delay
// before each restart (Flink: restart-strategy.fixed-delay.attempts, .delay).
func FixedDelayRestart(attempts int, delay time.Duration) RestartPolicy {
	return RestartPolicy{name: StrategyFixedDelay, attempts: attempts, delay: delay}
}

// NoRestart fails the job at its first failure.
func NoRestart() RestartPolicy { return RestartPolicy{name: StrategyNone} }

// FailureRateRestart restarts the job after delay unless more than
// maxFailures failures (this one included) happened within the last
// interval (Flink: restart-strategy.failure-rate.max-failures-per-interval,
// .failure-rate-interval, .delay).
func FailureRateRestart(maxFailures int, interval, delay time.Duration) RestartPolicy {
	return RestartPolicy{name: StrategyFailureRate, maxFailures: maxFailures, interval: interval, delay: delay}
}

// ExpOpt configures ExponentialDelayRestart.
type ExpOpt interface{ apply(*RestartPolicy) }

type expOpt func(*RestartPolicy)

func (o expOpt) apply(p *RestartPolicy) { o(p) }

// InitialBackoff is the delay before the first restart (default 1s).
func InitialBackoff(d time.Duration) ExpOpt { return expOpt(func(p *RestartPolicy) { p.initial = d }) }

// MaxBackoff caps the delay (default 1m).
func MaxBackoff(d time.Duration) ExpOpt { return expOpt(func(p *RestartPolicy) { p.max = d }) }

// BackoffMultiplier multiplies the delay after each failure (default 1.5).
func BackoffMultiplier(f float64) ExpOpt { return expOpt(func(p *RestartPolicy) { p.multiplier = f }) }

// ResetBackoffThreshold resets the delay to the initial backoff when the job
// ran this long without failing (default 1h).
func ResetBackoffThreshold(d time.Duration) ExpOpt {
	return expOpt(func(p *RestartPolicy) { p.reset = d })
}

// Jitter moves each delay by up to ±f of itself, so that many jobs failing
// together do not restart together (default 0.1; 0 for none).
func Jitter(f float64) ExpOpt { return expOpt(func(p *RestartPolicy) { p.jitter = f }) }

// ExponentialDelayRestart restarts the job without limit, the delay growing
// from the initial backoff by the multiplier after each failure up to the
// maximum, and back to the initial backoff after a run of the reset
// threshold without failure (Flink's exponential-delay strategy; defaults
// as Flink 1.19: 1s, 1m, 1.5, 1h, jitter 0.1).
func ExponentialDelayRestart(opts ...ExpOpt) RestartPolicy {
	p := RestartPolicy{name: StrategyExponentialDelay, initial: time.Second, max: time.Minute, multiplier: 1.5,
		reset: time.Hour, jitter: 0.1}
	for _, o := range opts {
		o.apply(&p)
	}
	return p
}

// Name is the strategy's Flink name: fixed-delay, exponential-delay,
// failure-rate or none.
func (p RestartPolicy) Name() string {
	if p.name == "" {
		return StrategyNone
	}
	return p.name
}

// String renders the policy in ParseRestartStrategy's syntax.
func (p RestartPolicy) String() string {
	switch p.name {
	case StrategyFixedDelay:
		return fmt.Sprintf("fixed-delay:attempts=%d,delay=%v", p.attempts, p.delay)
	case StrategyExponentialDelay:
		return fmt.Sprintf("exponential-delay:initial-backoff=%v,max-backoff=%v,multiplier=%v,reset-backoff-threshold=%v,jitter=%v",
			p.initial, p.max, p.multiplier, p.reset, p.jitter)
	case StrategyFailureRate:
		return fmt.Sprintf("failure-rate:max-failures=%d,interval=%v,delay=%v", p.maxFailures, p.interval, p.delay)
	}
	return StrategyNone
}

// validate refuses a policy that cannot work.
func (p RestartPolicy) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("restart strategy %s: "+format, append([]any{p.Name()}, args...)...)
	}
	switch p.name {
	case "", StrategyNone:
	case StrategyFixedDelay:
		if p.attempts < 0 || p.delay < 0 {
			return bad("attempts %d and delay %v must not be negative", p.attempts, p.delay)
		}
	case StrategyFailureRate:
		if p.maxFailures < 0 || p.interval <= 0 || p.delay < 0 {
			return bad("max-failures %d must not be negative, interval %v must be positive, delay %v must not be negative",
				p.maxFailures, p.interval, p.delay)
		}
	case StrategyExponentialDelay:
		switch {
		case p.initial <= 0 || p.max < p.initial:
			return bad("initial-backoff %v must be positive and at most max-backoff %v", p.initial, p.max)
		case p.multiplier < 1:
			return bad("multiplier %v must be at least 1", p.multiplier)
		case p.reset <= 0:
			return bad("reset-backoff-threshold %v must be positive", p.reset)
		case p.jitter < 0 || p.jitter > 1:
			return bad("jitter %v must be in [0, 1]", p.jitter)
		}
	default:
		return bad("unknown strategy")
	}
	return nil
}

// RestartDecision is what a RestartPolicy decided about one failure.
type RestartDecision struct {
	Restart bool
	// Delay to wait before the restart.
	Delay time.Duration
	// Attempt is the restart's number (1 for the first), or the number of
	// failures when the job fails.
	Attempt int
	// Reason says why the job fails (empty on a restart).
	Reason string
}

// Decide decides about the latest failure. failures are the times of every
// failure of the job so far, oldest first, the latest last (at least one).
// u in [0, 1) is the random draw the jitter of exponential-delay uses (0.5
// is no jitter); other strategies ignore it. Same input, same decision.
func (p RestartPolicy) Decide(failures []time.Time, u float64) RestartDecision {
	n := len(failures)
	d := RestartDecision{Attempt: n}
	switch p.name {
	case StrategyFixedDelay:
		if n > p.attempts {
			d.Reason = fmt.Sprintf("%d failures exceed fixed-delay's %d restart attempts", n, p.attempts)
			return d
		}
		d.Restart, d.Delay = true, p.delay
	case StrategyFailureRate:
		last, in := failures[n-1], 0
		for _, f := range failures {
			if last.Sub(f) < p.interval {
				in++
			}
		}
		if in > p.maxFailures {
			d.Reason = fmt.Sprintf("%d failures within %v exceed failure-rate's %d", in, p.interval, p.maxFailures)
			return d
		}
		d.Restart, d.Delay = true, p.delay
	case StrategyExponentialDelay:
		backoff := float64(p.initial)
		for i := 1; i < n; i++ {
			if failures[i].Sub(failures[i-1]) >= p.reset {
				backoff = float64(p.initial)
			} else {
				backoff = math.Min(backoff*p.multiplier, float64(p.max))
			}
		}
		delay := backoff + p.jitter*backoff*(2*u-1)
		delay = math.Max(0, math.Min(delay, float64(p.max)))
		d.Restart, d.Delay = true, time.Duration(delay)
	default:
		d.Reason = "restart strategy none"
		return d
	}
	return d
}

// maxDelay bounds the delay of any restart.
func (p RestartPolicy) maxDelay() time.Duration {
	if p.name == StrategyExponentialDelay {
		return p.max
	}
	return p.delay
}

// ParseRestartStrategy parses a restart strategy written as NAME or
// NAME:key=value,key=value:
//
//	none
//	fixed-delay:attempts=3,delay=1s
//	exponential-delay:initial-backoff=1s,max-backoff=1m,multiplier=1.5,reset-backoff-threshold=1h,jitter=0.1
//	failure-rate:max-failures=3,interval=1m,delay=1s
//
// Omitted keys take the constructors' defaults (fixed-delay: 3 attempts, 1s;
// failure-rate: 1 failure per 1m, 1s). Errors wrap ErrInvalidOption.
func ParseRestartStrategy(spec string) (RestartPolicy, error) {
	name, rest, _ := strings.Cut(strings.TrimSpace(spec), ":")
	var p RestartPolicy
	switch name {
	case StrategyNone:
		p = NoRestart()
	case StrategyFixedDelay:
		p = FixedDelayRestart(3, time.Second)
	case StrategyFailureRate:
		p = FailureRateRestart(1, time.Minute, time.Second)
	case StrategyExponentialDelay:
		p = ExponentialDelayRestart()
	default:
		return p, fmt.Errorf("%w: restart strategy %q: want none, fixed-delay, exponential-delay or failure-rate", ErrInvalidOption, spec)
	}
	fields := map[string]any{}
	switch name {
	case StrategyFixedDelay:
		fields = map[string]any{"attempts": &p.attempts, "delay": &p.delay}
	case StrategyFailureRate:
		fields = map[string]any{"max-failures": &p.maxFailures, "interval": &p.interval, "delay": &p.delay}
	case StrategyExponentialDelay:
		fields = map[string]any{"initial-backoff": &p.initial, "max-backoff": &p.max, "multiplier": &p.multiplier,
			"reset-backoff-threshold": &p.reset, "jitter": &p.jitter}
	}
	if rest != "" {
		for _, kv := range strings.Split(rest, ",") {
			k, v, ok := strings.Cut(kv, "=")
			dst, known := fields[k]
			if !ok || !known {
				return p, fmt.Errorf("%w: restart strategy %q: %q is not one of %s's keys", ErrInvalidOption, spec, kv, name)
			}
			var err error
			switch dst := dst.(type) {
			case *int:
				*dst, err = strconv.Atoi(v)
			case *time.Duration:
				*dst, err = time.ParseDuration(v)
			case *float64:
				*dst, err = strconv.ParseFloat(v, 64)
			}
			if err != nil {
				return p, fmt.Errorf("%w: restart strategy %q: %s: %w", ErrInvalidOption, spec, k, err)
			}
		}
	}
	if err := p.validate(); err != nil {
		return p, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	return p, nil
}
