package sharegroup

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/kafkatest"
)

// The rule takeUnpolled (lane.go) keeps, as kgo behaves: a share consumer's
// PollRecords ACCEPTs every record of the previous poll that was not
// acknowledged yet. A lane that holds records must never poll its client
// again; a closing lane that did (several rounds of takeUnpolled) ACCEPTed
// records nobody processed, under no marker. This test fails if kgo stops
// doing so, and the rule can then be revisited.
func TestAShareClientsPollAcceptsThePreviousPollsUnacknowledgedRecords(t *testing.T) {
	env := kafkatest.New(t, lockBroker(shortLock)...)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 10)
	admin := env.Client(t)
	if err := prepareGroup(t.Context(), admin, "g", true); err != nil {
		t.Fatal(err)
	}
	cl := env.Client(t, kgo.ShareGroup("g"), kgo.ConsumeTopics("in"), kgo.ShareMaxRecords(5), kgo.ShareMaxRecordsStrict())
	var first []*kgo.Record
	for deadline := time.Now().Add(10 * time.Second); len(first) == 0 && time.Now().Before(deadline); {
		cl.PollRecords(t.Context(), 0).EachRecord(func(r *kgo.Record) { first = append(first, r) })
	}
	if len(first) == 0 {
		t.Fatal("setup: the first poll returned no record")
	}
	if st := shareStart(t, env, "g", in0); st > 0 {
		t.Fatalf("setup: share start %d before any acknowledgement, want 0", st)
	}
	// Poll again without acknowledging the first poll's records.
	cl.PollRecords(t.Context(), 0)
	want := first[len(first)-1].Offset + 1
	var st int64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if st = shareStart(t, env, "g", in0); st >= want {
			return
		}
	}
	t.Fatalf("after a second poll the share start offset is %d, want at least %d: kgo no longer ACCEPTs the "+
		"previous poll's records (revisit the rule in lane.go's takeUnpolled)", st, want)
}
