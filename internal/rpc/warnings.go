package rpc

import (
	"fmt"
	"os"
	"runtime"
)

// Warnings for operators (docs/guide/security.md): settings Weir accepts
// but that leave a cluster open. The commands log them once at startup.

// MinTokenLength is the length under which a token draws a warning: 16
// random characters are beyond guessing over the network, and
// `openssl rand -hex 32` makes 64.
const MinTokenLength = 16

// TokenWarnings says what is risky about the token file at path, which
// holds token: a file other users may write (they can change the token)
// or others may read, and a token shorter than MinTokenLength. None on
// Windows, whose permission bits mean nothing here.
func TokenWarnings(path, token string) []string {
	var ws []string
	if fi, err := os.Stat(path); err == nil && runtime.GOOS != "windows" {
		switch perm := fi.Mode().Perm(); {
		case perm&0o022 != 0:
			ws = append(ws, fmt.Sprintf("auth token file %s is writable by group or others (mode %#o): anyone who can write it chooses the token; chmod 600 it", path, perm))
		case perm&0o004 != 0:
			ws = append(ws, fmt.Sprintf("auth token file %s is readable by others (mode %#o): every user of this machine can read the token; chmod 600 it", path, perm))
		}
	}
	if len(token) < MinTokenLength {
		ws = append(ws, fmt.Sprintf("auth token in %s has %d characters, fewer than %d: it can be guessed; make one with `openssl rand -hex 32`", path, len(token), MinTokenLength))
	}
	return ws
}

// ExposureWarnings says which of a process's listeners are open beyond
// loopback without protection. Each argument is an address or host ("" for
// none):
//   - tokenInClear: a job manager address with a token but no TLS (the
//     token crosses the network in clear);
//   - broker: the embedded broker (Kafka's protocol, no authentication);
//   - dataHostInClear: a task manager's --data-host when the control plane
//     has no TLS (records cross the network unencrypted).
func ExposureWarnings(tokenInClear []string, broker, dataHostInClear string) []string {
	var ws []string
	for _, addr := range tokenInClear {
		if addr != "" && BeyondLoopback(addr) {
			ws = append(ws, fmt.Sprintf("job manager listens beyond loopback on %s with a token but without TLS: the token and all traffic cross the network in clear; give --tls-cert and --tls-key", addr))
		}
	}
	if broker != "" && BeyondLoopback(broker) {
		ws = append(ws, fmt.Sprintf("the embedded broker listens beyond loopback on %s and has no authentication: anyone who reaches it can read, write and delete every topic; bind it to 127.0.0.1 or firewall it", broker))
	}
	if dataHostInClear != "" && BeyondLoopback(dataHostInClear) {
		ws = append(ws, fmt.Sprintf("--data-host %s is beyond loopback and the control plane has no TLS: records between task managers cross the network unencrypted; reach the job manager with --tls", dataHostInClear))
	}
	return ws
}
