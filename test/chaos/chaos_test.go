package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/internal/proctest"
)

// Summary is what a run of the suite reports (logged, and written as JSON
// to the file named by WEIR_CHAOS_SUMMARY).
type Summary struct {
	Seed   uint64         `json:"seed"`
	Rounds int            `json:"rounds"`
	Faults map[string]int `json:"faults_by_kind"`
	// RecordsVerified counts the output records checked, every one of
	// the three outputs of every round.
	RecordsVerified int `json:"records_verified"`
	Duplicates      int `json:"duplicates"`
	Losses          int `json:"losses"`
	// BrokerStateLost counts rounds that ended in the clear failure of a
	// transaction the embedded broker lost by design (kept apart: not a
	// violation, never silent).
	BrokerStateLost int `json:"broker_state_lost_rounds"`
	// Failed lists rounds with a violation, a hang or a fault not injected.
	Failed []string `json:"failed_rounds"`
	// Recovery: from the fault to output resuming (each output's first
	// committed record after the fault ended), over the rounds.
	RecoveryWorstMs  int64 `json:"recovery_worst_ms"`
	RecoveryMedianMs int64 `json:"recovery_median_ms"`
}

// roundResult is one round's outcome.
type roundResult struct {
	fault           fault
	records         int
	dups, lost      int
	recovery        time.Duration
	brokerStateLost bool
	problem         string
	logs            string // the processes' log tails, for a failed round
}

// TestChaosRoundsKeepEveryJobExactlyOnce runs the rounds; see the package
// doc. Short mode (the default): one round of each kind (failpoint,
// sigkill, partition, double, zombie), its variant drawn.
// WEIR_CHAOS_ROUNDS=every runs every variant of the catalogue once (14
// rounds); WEIR_CHAOS_ROUNDS=N runs N rounds of faults drawn at random;
// WEIR_CHAOS_SEED=S replays a run (the seed is logged).
func TestChaosRoundsKeepEveryJobExactlyOnce(t *testing.T) {
	seed := rand.Uint64N(1 << 32)
	if v := os.Getenv("WEIR_CHAOS_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("WEIR_CHAOS_SEED: %v", err)
		}
	}
	t.Logf("chaos seed %d (replay with WEIR_CHAOS_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0xc4a05))
	faults := catalogue(rng)
	rng.Shuffle(len(faults), func(i, j int) { faults[i], faults[j] = faults[j], faults[i] })
	switch v := os.Getenv("WEIR_CHAOS_ROUNDS"); v {
	case "every":
	case "":
		// The first of each kind in the shuffled catalogue.
		kinds := map[string]bool{}
		faults = slices.DeleteFunc(faults, func(f fault) bool {
			seen := kinds[f.kind]
			kinds[f.kind] = true
			return seen
		})
	default:
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("WEIR_CHAOS_ROUNDS=%q: want a positive number", v)
		}
		faults = faults[:0]
		for range n {
			faults = append(faults, anyFault(rng))
		}
	}
	if v := os.Getenv("WEIR_CHAOS_ONLY"); v != "" { // e.g. "zombie" or "partition broker"
		faults = slices.DeleteFunc(faults, func(f fault) bool { return !strings.Contains(f.name, v) && f.kind != v })
	}
	if len(faults) == 0 {
		t.Fatal("no round to run (WEIR_CHAOS_ONLY matches no fault of this mode)")
	}

	w := newWorld(t)
	sum := Summary{Seed: seed, Faults: map[string]int{}}
	var recoveries []time.Duration
	for i, f := range faults {
		r := w.round(i, f, rng)
		sum.Rounds++
		sum.Faults[f.kind]++
		sum.RecordsVerified += r.records
		sum.Duplicates += r.dups
		sum.Losses += r.lost
		status := fmt.Sprintf("round %d: %s: %d records verified, %d duplicates, %d lost, recovery %v",
			i, f.name, r.records, r.dups, r.lost, r.recovery.Round(time.Millisecond))
		switch {
		case r.brokerStateLost:
			sum.BrokerStateLost++
			t.Logf("%s; BROKER STATE LOST (a clear failure, counted apart): %s", status, r.problem)
		case r.problem != "" || r.dups > 0 || r.lost > 0:
			sum.Failed = append(sum.Failed, fmt.Sprintf("round %d (%s): %s", i, f.name, r.problem))
			t.Errorf("%s; FAILED: %s\n%s", status, r.problem, r.logs)
		default:
			t.Log(status)
		}
		if r.recovery > 0 {
			recoveries = append(recoveries, r.recovery)
		}
		// Written after every round, so a long run stopped early still
		// leaves the numbers so far.
		b := sum.write(t, recoveries)
		if i == len(faults)-1 {
			t.Logf("chaos summary: %s", b)
		}
	}
}

// write fills in the recovery times and writes the summary to the file
// named by WEIR_CHAOS_SUMMARY, if any; it returns the JSON.
func (sum *Summary) write(t *testing.T, recoveries []time.Duration) []byte {
	t.Helper()
	if len(recoveries) > 0 {
		sorted := slices.Sorted(slices.Values(recoveries))
		sum.RecoveryWorstMs = sorted[len(sorted)-1].Milliseconds()
		sum.RecoveryMedianMs = sorted[len(sorted)/2].Milliseconds()
	}
	b, err := json.Marshal(sum)
	if err != nil {
		t.Fatal(err)
	}
	if path := os.Getenv("WEIR_CHAOS_SUMMARY"); path != "" {
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Errorf("WEIR_CHAOS_SUMMARY: %v", err)
		}
	}
	return b
}

// round runs the three jobs on topics of their own, injects f while input
// arrives, and verifies their output record by record.
func (w *world) round(i int, f fault, rng *rand.Rand) (res roundResult) {
	t := w.t
	res.fault = f
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	in, up, cnt, cnt2 := fmt.Sprintf("in-%d", i), fmt.Sprintf("up-%d", i), fmt.Sprintf("cnt-%d", i), fmt.Sprintf("cnt2-%d", i)
	topics := roundTopics{in: in, up: up, cnt: cnt, cnt2: cnt2}
	w.ended = nil
	cl, err := kgo.NewClient(append(w.kafkaOpts(), kgo.DefaultProduceTopic(in), kgo.RecordRetries(1000),
		kgo.RetryTimeout(2*time.Minute))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, topic := range []string{in, up} {
		if _, err := kadm.NewClient(cl).CreateTopic(ctx, 4, 1, nil, topic); err != nil {
			t.Fatalf("create %s: %v", topic, err)
		}
	}
	if f.before != nil {
		f.before(w)
	}
	lines := 0
	feed := &kafkatest.Feeder{Lines: 10, Every: 50 * time.Millisecond}
	feed.Run(ctx, func(ctx context.Context, n int) error {
		recs := make([]*kgo.Record, n)
		for k := range recs {
			recs[k] = kgo.StringRecord(kafkatest.InputLine(lines))
			lines++
		}
		return cl.ProduceSync(ctx, recs...).FirstErr()
	})
	fed := false
	defer func() {
		if !fed {
			feed.Halt(t)
		}
	}()
	mon := w.monitor(ctx, cnt, up, cnt2)
	defer mon.stop()

	submit := func(job, group, from, to string) string {
		// The default restart strategy (exponential delay from 1 s), the
		// one users get.
		return w.cl.Submit(job, "--parallelism", "2", "--checkpoint-interval", "200ms",
			"--set", "brokers="+w.brokerProxy.Addr(), "--set", "group="+group, "--set", "input="+from, "--set", "output="+to)
	}
	jobs := []string{
		submit("wordcount", "wc-"+in, in, cnt),
		submit("uppercase", "up-"+in, in, up),
		submit("wordcount", "wc-"+up, up, cnt2),
	}
	defer func() {
		for _, id := range jobs {
			if _, err := w.cl.Run("cancel", id); err != nil {
				t.Logf("round %d: cancel %s: %v", i, id, err)
			}
		}
	}()
	// The fault comes once every job commits output, at a random moment;
	// a failpoint's comes when the process hits it (N drawn), maybe
	// before.
	if f.before == nil {
		if err := mon.waitAll(ctx, time.Now(), 90*time.Second); err != nil {
			res.problem, res.logs = fmt.Sprintf("no output before the fault: %v", err), w.logs(30)
			w.dump(ctx, i, jobs, topics)
			return res
		}
		time.Sleep(time.Duration(rng.IntN(2000)) * time.Millisecond)
	}
	start, err := f.inject(w)
	if err != nil {
		res.problem = fmt.Sprintf("fault not injected: %v", err)
		return res
	}
	ended := time.Now()
	if err := mon.waitAll(ctx, ended, 120*time.Second); err != nil {
		if lost := w.brokerLost(jobs); lost != "" {
			res.brokerStateLost, res.problem = true, lost
			return res
		}
		what := "a hang"
		if failed := w.failedJobs(jobs); failed != "" {
			what = "a job failed: " + failed
		}
		res.problem, res.logs = fmt.Sprintf("output did not resume after the fault (%s): %v", what, err), w.logs(40)+"\nstatuses: "+w.statuses(jobs)
		w.dump(ctx, i, jobs, topics)
		return res
	}
	res.recovery = mon.resumed(ended).Sub(start)
	time.Sleep(time.Second) // input keeps coming after the recovery
	feed.Halt(t)
	fed = true

	// Record by record, read_committed: every line once in up, every word
	// counted 1..n in cnt and cnt2.
	inRecs, err := kafkatest.ReadCommitted(ctx, []string{w.brokerAddr}, in, kgo.Dialer(w.dial))
	if err != nil {
		t.Fatalf("read %s: %v", in, err)
	}
	vals := make([]string, len(inRecs))
	want := map[string]int{}
	for k, r := range inRecs {
		vals[k] = string(r.Value)
		want[strings.ToUpper(vals[k])]++
	}
	counts := wordcount.Expected(vals)
	total := 0
	for _, n := range counts {
		total += n
	}
	for _, out := range []struct {
		topic string
		n     int
	}{{up, len(vals)}, {cnt, total}, {cnt2, total}} {
		recs, err := w.waitCommitted(ctx, out.topic, out.n, jobs)
		if err != nil {
			if lost := w.brokerLost(jobs); lost != "" {
				res.brokerStateLost, res.problem = true, lost
				return res
			}
			res.problem = fmt.Sprintf("%s: %v;", out.topic, err)
			if failed := w.failedJobs(jobs); failed != "" {
				res.problem += " a job failed: " + failed + ";"
			}
		}
		res.records += len(recs)
		if out.topic == up {
			dups, lost := checkLines(recs, want)
			res.dups += dups
			res.lost += lost
			if dups+lost > 0 {
				res.problem += fmt.Sprintf(" %s: %d duplicated lines, %d lost;", up, dups, lost)
			}
			continue
		}
		rep := wordcount.Check(recs, counts)
		res.dups += rep.Duplicates
		res.lost += rep.Lost
		if !rep.OK() {
			res.problem += fmt.Sprintf(" %s: %s;", out.topic, rep)
		}
	}
	if res.problem != "" {
		res.logs = w.logs(40)
		w.dump(ctx, i, jobs, topics)
	}
	return res
}

// checkLines compares the upper-cased lines read with want (each line's
// expected number of copies).
func checkLines(recs []*kgo.Record, want map[string]int) (dups, lost int) {
	seen := map[string]int{}
	for _, r := range recs {
		seen[string(r.Value)]++
	}
	for l, n := range seen {
		if n > want[l] {
			dups += n - want[l]
		}
	}
	for l, n := range want {
		if seen[l] < n {
			lost += n - seen[l]
		}
	}
	return dups, lost
}

// waitCommitted waits (2 min) until topic holds at least n records
// read_committed and returns them; at the deadline it returns what is
// there with an error.
func (w *world) waitCommitted(ctx context.Context, topic string, n int, jobs []string) ([]*kgo.Record, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		recs, err := kafkatest.ReadCommitted(rctx, []string{w.brokerAddr}, topic, kgo.Dialer(w.dial))
		cancel()
		if err == nil && len(recs) >= n {
			return recs, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return recs, fmt.Errorf("%d of %d records committed after 2 minutes (read: %v)", len(recs), n, err)
		}
		if w.brokerLost(jobs) != "" {
			return recs, fmt.Errorf("a job failed on a transaction the broker lost")
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// lostTxn matches the errors of kafkatxn.ErrTxnLost as a job's status
// carries them (a string): "pre-committed transaction lost", or
// "kafkatxn: transaction ID (producer P, epoch E) of checkpoint N lost".
var lostTxn = regexp.MustCompile(`pre-committed transaction lost|kafkatxn: transaction \S+ .*of checkpoint \d+ lost`)

// brokerLost returns the error of a job that failed because the embedded
// broker lost a transaction (kafkatxn.ErrTxnLost), or "".
func (w *world) brokerLost(jobs []string) string {
	for _, id := range jobs {
		out, err := w.cl.Run("status", id, "--output", "json")
		if err != nil {
			continue
		}
		var st proctest.JobStatus
		if json.Unmarshal([]byte(out), &st) == nil && st.State == "FAILED" && lostTxn.MatchString(st.Error) {
			return fmt.Sprintf("job %s failed: %s", id, st.Error)
		}
	}
	return ""
}

// failedJobs describes the jobs that FAILED, with their errors, or "".
func (w *world) failedJobs(jobs []string) string {
	var b strings.Builder
	for _, id := range jobs {
		out, err := w.cl.Run("status", id, "--output", "json")
		if err != nil {
			continue
		}
		var st proctest.JobStatus
		if json.Unmarshal([]byte(out), &st) == nil && st.State == "FAILED" {
			fmt.Fprintf(&b, "%s %s (%s); ", st.Name, id, st.Error)
		}
	}
	return b.String()
}

// statuses describes each job's status, for a failure message.
func (w *world) statuses(jobs []string) string {
	var b strings.Builder
	for _, id := range jobs {
		out, err := w.cl.Run("status", id, "--output", "json")
		fmt.Fprintf(&b, "[%s %v] ", strings.TrimSpace(out), err)
	}
	return b.String()
}

// monitor is an independent read_committed consumer of the outputs that
// notes when each one's records arrive: output resuming after a fault.
type monitor struct {
	topics []string
	cl     *kgo.Client
	done   chan struct{}

	mu   sync.Mutex
	seen map[string][]time.Time // per topic, when a fetch brought records
}

func (w *world) monitor(ctx context.Context, topics ...string) *monitor {
	// The jobs create their output topics: the monitor must not
	// (auto-creation), it looks for them often until they exist.
	cl, err := kgo.NewClient(append(w.kafkaOpts(), kgo.ConsumeTopics(topics...),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.MetadataMinAge(100*time.Millisecond), kgo.MetadataMaxAge(time.Second))...)
	if err != nil {
		w.t.Fatal(err)
	}
	m := &monitor{topics: topics, cl: cl, done: make(chan struct{}), seen: map[string][]time.Time{}}
	go func() {
		defer close(m.done)
		for {
			fs := cl.PollFetches(ctx)
			if fs.IsClientClosed() || ctx.Err() != nil {
				return
			}
			now := time.Now()
			m.mu.Lock()
			got := map[string]bool{}
			fs.EachRecord(func(r *kgo.Record) { got[r.Topic] = true })
			for topic := range got {
				m.seen[topic] = append(m.seen[topic], now)
			}
			m.mu.Unlock()
		}
	}()
	return m
}

func (m *monitor) stop() {
	m.cl.Close()
	<-m.done
}

// after returns when topic first got records after t (zero: not yet).
func (m *monitor) after(topic string, t time.Time) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.seen[topic] {
		if s.After(t) {
			return s
		}
	}
	return time.Time{}
}

// waitAll waits until every topic got records after t.
func (m *monitor) waitAll(ctx context.Context, t time.Time, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		var missing []string
		for _, topic := range m.topics {
			if m.after(topic, t).IsZero() {
				missing = append(missing, topic)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no new committed output on %v within %v", missing, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// resumed is when the last of the outputs resumed after t.
func (m *monitor) resumed(t time.Time) time.Time {
	var last time.Time
	for _, topic := range m.topics {
		if s := m.after(topic, t); s.After(last) {
			last = s
		}
	}
	return last
}
