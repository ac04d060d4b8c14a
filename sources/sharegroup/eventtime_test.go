package sharegroup

import (
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/kafkatest"
)

// stampCollector records each value with the event timestamp it was
// emitted with.
type stampCollector struct{ ts map[string][]int64 }

func (c *stampCollector) Collect(v string) { c.CollectWithTimestamp(v, -1) }
func (c *stampCollector) CollectWithTimestamp(v string, ts int64) {
	c.ts[v] = append(c.ts[v], ts)
}

// A record's event timestamp is its Kafka record timestamp by default (the
// producer's CreateTime here): every record once, with its own timestamp.
func TestRecordsCarryTheirKafkaTimestampAsEventTime(t *testing.T) {
	const n = 50
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 2, nil)
	base := time.UnixMilli(1_700_000_000_000)
	cl := env.Client(t, kgo.DefaultProduceTopic("in"))
	var recs []*kgo.Record
	for i := 0; i < n; i++ {
		r := kgo.StringRecord(strconv.Itoa(i))
		r.Timestamp = base.Add(time.Duration(i*37%n) * time.Second) // out of order
		recs = append(recs, r)
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	s := openSource(t, env, 0, nil)
	c := &stampCollector{ts: map[string][]int64{}}
	for deadline := time.Now().Add(20 * time.Second); len(c.ts) < n && time.Now().Before(deadline); {
		if err := s.Poll(t.Context(), c); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		want := base.Add(time.Duration(i*37%n) * time.Second).UnixMilli()
		got := c.ts[strconv.Itoa(i)]
		if len(got) != 1 || got[0] != want {
			t.Errorf("record %d: emitted with timestamps %v, want once with %d", i, got, want)
		}
	}
}
