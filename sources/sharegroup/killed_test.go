package sharegroup

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/internal/proctest"
)

const killedLanesEnv = "WEIR_SHAREGROUP_KILLED_LANES_CHILD"

// TestKilledLanesChild is the process killed by
// TestPartitionsOfKilledMembersWaitForTheSessionTimeout: both lanes of its
// subtask joined the group and hold a batch when it says so.
func TestKilledLanesChild(t *testing.T) {
	addr := os.Getenv(killedLanesEnv)
	if addr == "" {
		t.Skip("helper process for TestPartitionsOfKilledMembersWaitForTheSessionTimeout")
	}
	s := openChildSource(t, addr, 2, 10)
	c := &sliceCollector{}
	for {
		if err := s.Poll(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		s.life.Lock()
		started := s.nextLane
		s.life.Unlock()
		if started == 2 && len(c.vals) >= 20 {
			break
		}
	}
	fmt.Println("JOINED")
	time.Sleep(time.Minute) // killed long before
}

// The assignment that keeps a restarted attempt's lanes from some
// partitions after a process was killed: its share-group members never
// leave, so the broker counts them, with their partitions, until the
// session timeout fences them (kfake's assignor, like Kafka's simple
// assignor, is sticky and counts every member: with no more members than
// partitions, each partition has one member and the killed ones keep
// theirs). Two killed lanes and two new ones on four partitions: the new
// lanes read two partitions at once, the other two only after the session
// timeout, and every record is read once. A fact of the brokers' group
// protocol, not of Weir (docs/internals/recovery.md): this test fails if
// the broker fences killed members sooner, and the page is then to be
// revisited.
func TestPartitionsOfKilledMembersWaitForTheSessionTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	const sessionTimeout = 4 * time.Second
	env := kafkatest.New(t, broker.Config("group.share.session.timeout.ms", strconv.Itoa(int(sessionTimeout.Milliseconds()))))
	env.CreateTopic(t, "in", 4, nil)
	const perPartition = 100
	for p := range int32(4) {
		produceTo(t, env, "in", p, int(p)*perPartition, int(p+1)*perPartition)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledLanesChild$")
	cmd.Env = append(os.Environ(), killedLanesEnv+"="+env.Addr)
	child := proctest.Start(t, cmd)
	child.Line(t, `^(JOINED)$`)
	child.Kill(t)
	killed := time.Now()

	s := openSource(t, env, 0, nil, Lanes(2), BatchSize(10))
	c := &sliceCollector{}
	var all []string
	first := map[int]time.Duration{} // partition -> first record, from the kill
	var id checkpoint.ID
	for last := time.Now(); len(all) < 4*perPartition && time.Since(killed) < sessionTimeout+10*time.Second; {
		if err := s.Poll(t.Context(), c); err != nil {
			t.Fatal(err)
		}
		for _, v := range c.vals {
			i, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("value %q", v)
			}
			if _, ok := first[i/perPartition]; !ok {
				first[i/perPartition] = time.Since(killed)
			}
		}
		all, c.vals = append(all, c.vals...), nil
		if time.Since(last) >= 100*time.Millisecond {
			id++
			if _, err := s.Snapshot(t.Context(), id); err != nil {
				t.Fatal(err)
			}
			notifyComplete(t, s, id)
			last = time.Now()
		}
	}
	t.Logf("first record of each partition after the kill: %v", first)
	if msg := exactlyOnce(counts(t, all), 4*perPartition); msg != "" {
		t.Fatalf("after the kill: %s", msg)
	}
	var soon, late []int
	for p := range 4 {
		// The killed members heartbeated last up to a heartbeat
		// interval (1 s) before the kill.
		if first[p] < sessionTimeout/2 {
			soon = append(soon, p)
		} else {
			late = append(late, p)
		}
	}
	if len(soon) != 2 || len(late) != 2 {
		t.Fatalf("partitions read within %v of the kill: %v, later: %v; want two and two (the killed lanes' two wait for the session timeout, %v)",
			sessionTimeout/2, soon, late, sessionTimeout)
	}
	if at := first[late[0]]; at < sessionTimeout-time.Second-200*time.Millisecond {
		t.Fatalf("a killed lane's partition was read %v after the kill, before the session timeout could fence its member", at)
	}
}
