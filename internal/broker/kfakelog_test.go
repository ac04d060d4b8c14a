package broker

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// TestKfakeSlowEndTxnWarningIsDebug: kfake warns when an EndTxn took over
// 5 ms, which a loaded machine does routinely; the broker logs it at debug
// level so that INFO stays quiet. Other kfake warnings stay warnings.
func TestKfakeSlowEndTxnWarningIsDebug(t *testing.T) {
	var got []string
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()),
		zapcore.AddSync(writerFunc(func(p []byte) { got = append(got, strings.TrimSpace(string(p))) })), zapcore.DebugLevel)
	l := &kfakeLogger{log: zap.New(core)}
	l.Logf(kfake.LogLevelWarn, "txn: EndTxn slow pid=%d epoch=%d elapsed=%dms batches=%d groups=%d", 1, 2, 6, 3, 0)
	l.Logf(kfake.LogLevelWarn, "pids.log: discarding %d corrupt trailing bytes", 7)
	if len(got) != 2 || !strings.Contains(got[0], "DEBUG") || !strings.Contains(got[1], "WARN") {
		t.Fatalf("logged %q, want the slow EndTxn at DEBUG and the other warning at WARN", got)
	}
}

type writerFunc func([]byte)

func (f writerFunc) Write(p []byte) (int, error) {
	f(p)
	return len(p), nil
}
