package chaos

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"time"

	"github.com/weirstream/weir/internal/chaosproxy"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/proctest"
)

// fault is one fault a round injects.
type fault struct {
	// kind groups faults in the summary: failpoint, sigkill, partition,
	// double, zombie.
	kind string
	// name says exactly what was done, e.g. "sigkill tm-a" or "partition
	// broker blackhole 4.1s (above the heartbeat timeout)".
	name string
	// before runs before the round's jobs are submitted (a process
	// restarted with failpoints set).
	before func(w *world)
	// inject runs once the jobs produce output and returns when the fault
	// is over (the process restarted, the partition healed): start is when
	// it hit. A fault that could not be injected returns an error.
	inject func(w *world) (start time.Time, err error)
}

// failpoints: each one with crash, on the process that hits it.
var failpoints = []string{
	failpoint.SourceAfterAckPrecommit, failpoint.SinkAfterPrecommit, failpoint.JMAfterCheckpointPersisted,
	failpoint.SinkAfterCommit, failpoint.SourceAfterAckCommit, failpoint.TaskProcess,
}

var killTargets = []string{"tm-a", "jobmanager", "broker"}

// catalogue lists one fault of each kind and variant the short mode
// covers: every failpoint, a SIGKILL of each process, a partition of each
// link (drop or black hole, healed below or above the heartbeat timeout
// and the lock duration), a second fault during recovery, and the zombie.
func catalogue(rng *rand.Rand) []fault {
	var fs []fault
	for _, name := range failpoints {
		fs = append(fs, failpointCrash(rng, name))
	}
	for _, target := range killTargets {
		fs = append(fs, sigkill(rng, target))
	}
	for _, link := range partitionTargets {
		fs = append(fs, partition(rng, link))
	}
	fs = append(fs, double(rng), zombie(rng))
	return fs
}

// anyFault draws one fault of any kind, for the long mode.
func anyFault(rng *rand.Rand) fault {
	switch rng.IntN(5) {
	case 0:
		return failpointCrash(rng, failpoints[rng.IntN(len(failpoints))])
	case 1:
		return sigkill(rng, killTargets[rng.IntN(len(killTargets))])
	case 2:
		return partition(rng, partitionTargets[rng.IntN(len(partitionTargets))])
	case 3:
		return double(rng)
	}
	return zombie(rng)
}

// failpointCrash restarts the process that hits failpoint name with
// name=crash@N (N drawn), waits for the crash and starts the process
// again without failpoints.
func failpointCrash(rng *rand.Rand, name string) fault {
	n := 2 + rng.IntN(8) // checkpoints
	if name == failpoint.TaskProcess {
		n = 200 + rng.IntN(2000) // records
	}
	env := []string{fmt.Sprintf("WEIR_FAILPOINTS=%s=crash@%d", name, n)}
	onJM := name == failpoint.JMAfterCheckpointPersisted
	f := fault{kind: "failpoint", name: fmt.Sprintf("failpoint %s=crash@%d", name, n)}
	// crashed receives when the process with the failpoint exited: the
	// crash may come before the round's output does.
	crashed := make(chan time.Time, 1)
	f.before = func(w *world) {
		var p *proctest.Proc
		if onJM {
			w.restartJM(env)
			p = w.cl.JM
		} else {
			w.restartTM("tm-a", env)
			p = w.cl.TMs["tm-a"]
		}
		go func() {
			<-p.Done
			crashed <- time.Now()
		}()
	}
	f.inject = func(w *world) (time.Time, error) {
		var start time.Time
		select {
		case start = <-crashed:
		case <-time.After(90 * time.Second):
			// Not hit: take the failpoint out for the next rounds.
			if onJM {
				w.restartJM(nil)
			} else {
				w.restartTM("tm-a", nil)
			}
			return time.Time{}, fmt.Errorf("failpoint %s not hit %d times within 90s", name, n)
		}
		if onJM {
			w.startJM(nil)
		} else {
			w.startTM("tm-a", nil)
		}
		return start, nil
	}
	return f
}

// sigkill kills target at the round's random moment and starts it again
// on the same data after a random pause.
func sigkill(rng *rand.Rand, target string) fault {
	down := time.Duration(rng.IntN(500)) * time.Millisecond
	return fault{kind: "sigkill", name: fmt.Sprintf("sigkill %s, restarted after %v", target, down),
		inject: func(w *world) (time.Time, error) {
			start := time.Now()
			w.killAndRestart(target, down)
			return start, nil
		}}
}

func (w *world) killAndRestart(target string, down time.Duration) {
	w.t.Helper()
	switch target {
	case "broker":
		kill(w.t, w.broker.Proc)
		time.Sleep(down)
		w.startBroker()
	case "jobmanager":
		kill(w.t, w.cl.JM)
		time.Sleep(down)
		w.startJM(nil)
	default:
		kill(w.t, w.cl.TMs[target])
		time.Sleep(down)
		w.startTM(target, nil)
	}
}

// partitionFor draws how long a partition lasts: below the heartbeat
// timeout, between it and the lock duration, or above the lock duration.
func partitionFor(rng *rand.Rand) (time.Duration, string) {
	ms := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)))/time.Millisecond*time.Millisecond
	}
	switch rng.IntN(3) {
	case 0:
		return ms(500*time.Millisecond, heartbeatTimeout-500*time.Millisecond), "below the heartbeat timeout"
	case 1:
		return ms(heartbeatTimeout+500*time.Millisecond, lockDuration-500*time.Millisecond), "above the heartbeat timeout, below the record lock"
	}
	return ms(lockDuration+500*time.Millisecond, lockDuration+3*time.Second), "above the record lock"
}

// partition cuts link (drop or black hole) for a random time, then heals.
func partition(rng *rand.Rand, link string) fault {
	mode := []chaosproxy.Mode{chaosproxy.Drop, chaosproxy.BlackHole}[rng.IntN(2)]
	d, why := partitionFor(rng)
	return fault{kind: "partition", name: fmt.Sprintf("partition %s %v for %v (%s)", link, mode, d, why),
		inject: func(w *world) (time.Time, error) {
			ps := w.proxies(link)
			used := 0
			for _, p := range ps {
				used += p.Accepted()
			}
			if used == 0 {
				return time.Time{}, fmt.Errorf("no connection went through the %s proxies: the partition would cut nothing", link)
			}
			start := time.Now()
			for _, p := range ps {
				p.Set(mode)
			}
			time.Sleep(d)
			for _, p := range ps {
				p.Heal()
			}
			return start, nil
		}}
}

// double kills tm-a, and while the job recovers from it, kills a second
// process (tm-b, the job manager or the broker).
func double(rng *rand.Rand) fault {
	second := []string{"tm-b", "jobmanager", "broker"}[rng.IntN(3)]
	gap := time.Duration(200+rng.IntN(1300)) * time.Millisecond
	return fault{kind: "double", name: fmt.Sprintf("sigkill tm-a, then %v later sigkill %s", gap, second),
		inject: func(w *world) (time.Time, error) {
			start := time.Now()
			w.killAndRestart("tm-a", 0)
			time.Sleep(gap)
			w.killAndRestart(second, 0)
			return start, nil
		}}
}

// zombie pauses tm-a (SIGSTOP) past the record lock and resumes it: its
// locks lapse, the job manager loses it, the job recovers on tm-b, and
// then the paused tasks wake up holding records someone else processed.
func zombie(rng *rand.Rand) fault {
	d := lockDuration + time.Second + time.Duration(rng.IntN(2000))*time.Millisecond
	return fault{kind: "zombie", name: fmt.Sprintf("SIGSTOP tm-a for %v, then SIGCONT", d),
		inject: func(w *world) (time.Time, error) {
			p := w.cl.TMs["tm-a"].Cmd.Process
			start := time.Now()
			if err := p.Signal(syscall.SIGSTOP); err != nil {
				return start, err
			}
			time.Sleep(d)
			return start, p.Signal(syscall.SIGCONT)
		}}
}
