package sharegroup

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/internal/kafkatxn"
	"github.com/weirstream/weir/runtime"
)

// TestSourceFailsForGoodWhenARestoredMarkerTransactionIsLost: the restored
// checkpoint names an ack-marker transaction the broker aborted (as at its
// transaction timeout). Its acknowledgements are gone, and every restart
// would find the same: Open must fail unrecoverably with ErrTxnLost, at
// every attempt, instead of restarting the job forever.
func TestSourceFailsForGoodWhenARestoredMarkerTransactionIsLost(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 1, nil)
	env.CreateTopic(t, "elsewhere", 1, nil)
	ctx := t.Context()
	w, err := kafkatxn.NewTxnWriter(ctx, kafkatxn.Brokers(env.Addr), kafkatxn.TransactionalIDPrefix("lost"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, &kgo.Record{Topic: "elsewhere", Value: []byte("marker")}); err != nil {
		t.Fatal(err)
	}
	h, ok, err := w.PreCommit(ctx, 1)
	if err != nil || !ok {
		t.Fatalf("PreCommit: %v, %v", ok, err)
	}
	if err := kafkatxn.EndTxn(ctx, env.Client(t), h, false); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= 2; attempt++ {
		_, err := openSourceErr(t, env, 0, []checkpoint.TxnHandle{h})
		if !errors.Is(err, kafkatxn.ErrTxnLost) || !runtime.IsUnrecoverable(err) {
			t.Fatalf("attempt %d: Open = %v, want an unrecoverable error wrapping ErrTxnLost", attempt, err)
		}
	}
}
