package cli

import (
	"bytes"
	"regexp"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/examples/wordcount"
)

// local --checkpoint-storage embedded: the wordcount's task state goes to
// the in-process S3 server (nothing stays inline with
// --state-inline-limit 0), every word is counted exactly once, and the
// checkpoints' state is there, by reference.
func TestLocalWithEmbeddedCheckpointStorageWritesTaskStateThere(t *testing.T) {
	c := startLocal(t, "--taskmanagers", "2", "--slots", "2", "--checkpoint-storage", "embedded", "--state-inline-limit", "0")
	m := regexp.MustCompile(`(?m)^checkpoint storage (s3://\S+)$`).FindStringSubmatch(c.out.String())
	if m == nil {
		t.Fatalf("local did not print its checkpoint storage: %q", c.out.String())
	}
	lines := testLines(400, "s")
	produceLines(t, c.broker, "lines", lines)
	id := c.submitWordcount(t, "200ms")
	waitCounted(t, c.broker, "counts", wordcount.Expected(lines))
	st, err := storage.Open(t.Context(), m[1], storage.Credentials("weir", "weir"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		n := 0
		if err := st.List(t.Context(), checkpoint.SharedPrefix(id), func(storage.Object) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no object under %s in the embedded checkpoint storage", checkpoint.SharedPrefix(id))
		}
	}
	if _, err := c.cli(t, "cancel", id); err != nil {
		t.Fatal(err)
	}
}

func TestStorageFlagsRefuseWhatCannotWork(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"jobmanager", "--checkpoint-storage", "embedded"}, `--checkpoint-storage embedded is for "streamctl local"`},
		{[]string{"jobmanager", "--checkpoint-storage", "ftp://x"}, "unknown scheme"},
		{[]string{"jobmanager", "--checkpoint-orphan-grace", "-1s"}, "must not be negative"},
		{[]string{"run", "wordcount", "--state-inline-limit", "-2"}, "--state-inline-limit -2"},
	} {
		var out, errs bytes.Buffer
		root := newRootCmd(testRegistry(t), &out, &errs)
		root.SetArgs(tc.args)
		err := root.ExecuteContext(t.Context())
		if err == nil || !regexp.MustCompile(regexp.QuoteMeta(tc.want)).MatchString(err.Error()) {
			t.Errorf("%v: error %v, want one saying %q", tc.args, err, tc.want)
		}
	}
}
