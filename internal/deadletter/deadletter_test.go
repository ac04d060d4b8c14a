package deadletter

import (
	"context"
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// recorder is a Writer that keeps what it was given.
type recorder struct{ recs []*kgo.Record }

func (w *recorder) Write(_ context.Context, r *kgo.Record) error {
	w.recs = append(w.recs, r)
	return nil
}

// A dead letter keeps the record's key, value and headers, and adds the
// reason (with the job's last task failure) and the record's origin.
func TestSendCopiesTheRecordWithItsReasonAndOrigin(t *testing.T) {
	r := &kgo.Record{Topic: "clicks", Partition: 3, Offset: 42, Key: []byte("k"), Value: []byte("{bad"),
		Headers: []kgo.RecordHeader{{Key: "trace", Value: []byte("t1")}}}
	w := &recorder{}
	if err := Send(t.Context(), w, zap.NewNop(), r, "dlq", errors.New("decode: bad json"), "task failed"); err != nil {
		t.Fatal(err)
	}
	if len(w.recs) != 1 {
		t.Fatalf("%d records written, want 1", len(w.recs))
	}
	d := w.recs[0]
	hs := map[string]string{}
	for _, h := range d.Headers {
		hs[h.Key] = string(h.Value)
	}
	want := map[string]string{"trace": "t1", HeaderError: "decode: bad json; last task failure: task failed",
		HeaderDeliveryCount: "0", HeaderTopic: "clicks", HeaderPartition: "3", HeaderOffset: "42"}
	if d.Topic != "dlq" || string(d.Key) != "k" || string(d.Value) != "{bad" || len(hs) != len(want) {
		t.Fatalf("dead letter %s %q=%q headers %v", d.Topic, d.Key, d.Value, hs)
	}
	for k, v := range want {
		if hs[k] != v {
			t.Errorf("header %s = %q, want %q", k, hs[k], v)
		}
	}
}
