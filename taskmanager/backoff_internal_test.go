package taskmanager

import (
	"errors"
	"testing"
	"time"

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
