package cli

import (
	"strings"
	"testing"
)

// The high-availability flags are refused, with what to do, when they do
// not make a cluster: HA without shared checkpoint storage (a new leader
// could not read the checkpoints), etcd without endpoints, HA options on a
// standalone job manager, an unknown mode.
func TestJobManagerRefusesHighAvailabilityFlagsThatCannotWork(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ha", "etcd", "--etcd-endpoints", "http://127.0.0.1:1"}, "--ha etcd needs --checkpoint-storage"},
		{[]string{"--ha", "embedded"}, "--ha embedded needs --checkpoint-storage"},
		{[]string{"--ha", "etcd", "--checkpoint-storage", "mem://x"}, "--ha etcd needs --etcd-endpoints"},
		{[]string{"--checkpoint-storage", "mem://x"}, "--checkpoint-storage needs --ha etcd or embedded"},
		{[]string{"--etcd-endpoints", "http://127.0.0.1:1"}, "--etcd-endpoints needs --ha etcd or embedded"},
		{[]string{"--ha", "zookeeper"}, `--ha "zookeeper": want standalone, etcd or embedded`},
		{[]string{"--ha", "embedded", "--etcd-endpoints", "http://127.0.0.1:1", "--checkpoint-storage", "mem://x"}, "--ha embedded runs its own etcd"},
		{[]string{"--ha", "etcd", "--etcd-endpoints", "http://127.0.0.1:1", "--checkpoint-storage", "mem://x", "--etcd-cert", "c.pem"}, "--etcd-cert and --etcd-key go together"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, _, err := runCLI(t, append([]string{"jobmanager", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}
