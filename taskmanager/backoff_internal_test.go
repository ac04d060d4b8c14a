package taskmanager

import (
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// While the token is refused the pause doubles from the reconnect delay up
// to maxAuthBackoff; any other loss reconnects at the reconnect delay.
func TestReconnectDelayBacksOffOnlyOnARefusedToken(t *testing.T) {
	const base = 500 * time.Millisecond
	refused := status.Error(codes.Unauthenticated, "wrong token")
	lost := errors.New("connection closed")
	for _, tc := range []struct {
		name string
		prev time.Duration
		err  error
		want time.Duration
	}{
		{"first refusal", 0, refused, base},
		{"second refusal", base, refused, 2 * base},
		{"refusal near the cap", 20 * time.Second, refused, maxAuthBackoff},
		{"refusal at the cap", maxAuthBackoff, refused, maxAuthBackoff},
		{"other loss", 0, lost, base},
		{"other loss after refusals", 8 * time.Second, lost, base},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := reconnectDelay(tc.prev, base, tc.err); got != tc.want {
				t.Fatalf("reconnectDelay(%v, %v, %v) = %v, want %v", tc.prev, base, tc.err, got, tc.want)
			}
		})
	}
}

// A task manager that cannot reach its job manager for 25 s, retrying
// every 500 ms (a job-manager failover), warns when the session is lost and
// then once per outageLogInterval with what it tried, not 50 times; once a
// session registered again, the next loss is warned of at once.
func TestAnOutageIsWarnedOnceThenSummarized(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(core)
	var o outage
	start := time.Unix(1_800_000_000, 0)
	lost := errors.New("connection refused")
	for i := 0; i <= 50; i++ {
		o.failed(log, start.Add(time.Duration(i)*500*time.Millisecond), "127.0.0.1:6123", 500*time.Millisecond, lost)
	}
	warns := logs.FilterLevelExact(zapcore.WarnLevel).All()
	if len(warns) != 3 || warns[0].Message != "job manager session lost; reconnecting" ||
		warns[1].Message != "still reconnecting to the job manager" || warns[2].Message != "still reconnecting to the job manager" {
		t.Fatalf("%d warnings %v; want the loss, then a summary every %v (at 10 s and 20 s)", len(warns), warns, outageLogInterval)
	}
	if m := warns[2].ContextMap(); m["attempts"] != int64(41) || m["attempts_since_last_logged"] != int64(20) || m["for"] != 20*time.Second {
		t.Errorf("the second summary says %v; want 41 attempts, 20 since the last warning, for 20s", m)
	}
	o = outage{} // a session registered
	o.failed(log, start.Add(time.Minute), "127.0.0.1:6123", 500*time.Millisecond, lost)
	if n := logs.FilterMessage("job manager session lost; reconnecting").Len(); n != 2 {
		t.Errorf("after a session registered, a new loss was warned of %d times in all, want 2", n)
	}
}
