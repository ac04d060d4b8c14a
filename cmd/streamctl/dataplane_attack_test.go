package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/internal/proctest"
)

// deployedData is where one task manager's share of an attempt receives
// records, from its "tasks deployed" log line.
type deployedData struct {
	Msg     string `json:"msg"`
	Job     string `json:"job"`
	Attempt int32  `json:"attempt"`
	Addr    string `json:"data_address"`
}

// dataAddress returns the data address of the latest attempt of job on
// task manager p, from its JSON log.
func dataAddress(t *testing.T, p *proctest.Proc, job string) deployedData {
	t.Helper()
	var last deployedData
	sc := bufio.NewScanner(strings.NewReader(p.Stderr.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var d deployedData
		if json.Unmarshal(sc.Bytes(), &d) == nil && d.Msg == "tasks deployed" && d.Job == job && d.Attempt >= last.Attempt {
			last = d
		}
	}
	if last.Addr == "" {
		t.Fatalf("no data address of job %s in the task manager's log:\n%s", job, p.Stderr.Tail(40))
	}
	return last
}

// rawFrame is a data-plane frame as the wire carries it: kind, channel,
// length, payload; the length may lie.
func rawFrame(kind byte, ch, n uint32, payload []byte) []byte {
	b := []byte{kind}
	b = binary.BigEndian.AppendUint32(b, ch)
	b = binary.BigEndian.AppendUint32(b, n)
	return append(b, payload...)
}

// forgedHello is what a sender sends first without knowing any secret:
// the attempt and the job id, which the logs and the REST API show.
func forgedHello(d deployedData) []byte {
	p := binary.BigEndian.AppendUint32(nil, uint32(d.Attempt))
	return rawFrame(6, 0, uint32(len(p)+len(d.Job)), append(p, d.Job...))
}

// forgedBatch is a runtime batch message of n string records word.
func forgedBatch(word string, n int) []byte {
	b := []byte{1}
	for range n {
		b = binary.AppendUvarint(b, uint64(len(word)))
		b = append(b, word...)
	}
	return b
}

// dataFrame wraps an Exchange message in a data frame of channel ch.
func dataFrame(ch uint32, msg []byte) []byte { return rawFrame(1, ch, uint32(len(msg)), msg) }

// Anyone who reaches a task manager's data port tries what the data plane
// protocol allows, on every channel number the wordcount's graph uses
// (parallelism 2: channels 0..3) and more: records of words never in the
// input, barriers, ends of stream, an open on the live channel, a frame
// declaring 64 MiB, a malformed frame, each on a connection of its own.
// Nothing of it is committed (every word of the input counted exactly
// 1..n read_committed, no other word), and the job does not restart.
func TestDataPlaneRefusesStrangersWithoutDisturbingARunningJob(t *testing.T) {
	t.Parallel()
	for _, tls := range []bool{false, true} {
		name := "plaintext"
		if tls {
			name = "TLS and token" // the data plane runs over TLS too
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			attackDataPlane(t, tls)
		})
	}
}

// tlsCluster is a cluster whose job manager serves TLS and requires a
// token, its task managers and clients giving both.
func tlsCluster(t *testing.T) *procCluster {
	t.Helper()
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("a-token-for-the-data-plane-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &procCluster{Cluster: proctest.NewStoppedCluster(t, streamctlBin), t: t, env: kafkatest.New(t)}
	c.JMArgs = []string{"--tls-cert", cert, "--tls-key", key, "--auth-token-file", token}
	c.ClientArgs = []string{"--tls-ca", cert, "--auth-token-file", token}
	c.StartJM()
	c.StartTM("tm-a", 2)
	c.StartTM("tm-b", 2)
	deadline := time.Now().Add(60 * time.Second)
	for _, tm := range []string{"tm-a", "tm-b"} {
		for !strings.Contains(c.TMs[tm].Stderr.String(), "registered with the job manager") {
			if time.Now().After(deadline) {
				t.Fatalf("task manager %s did not register within 60s; %s", tm, c.Logs(20))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

func attackDataPlane(t *testing.T, tls bool) {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	var c *procCluster
	if tls {
		c = tlsCluster(t)
	} else {
		c = newProcCluster(t, streamctlBin)
		c.twoTMs()
	}
	in := newInput(t, ctx, c.env.Addr, "lines", 300)
	in.run(ctx)
	id := c.Submit(wordcountArgs(c.env.Addr, "wc", "lines", "counts")...)
	c.waitOutput(ctx, "counts", 600)
	before := c.Status(id)
	if before.State != "RUNNING" {
		t.Fatalf("status before the attack: %+v", before)
	}
	var barrier []byte
	barrier = binary.AppendUvarint(append(barrier, 2), 1<<40) // a checkpoint id far ahead
	attacks := []struct {
		name   string
		frames func(d deployedData) [][]byte
	}{
		{"records on every channel", func(d deployedData) [][]byte {
			var fs [][]byte
			for ch := range uint32(4) {
				fs = append(fs, dataFrame(ch, forgedBatch("injected", 100)), dataFrame(ch, forgedBatch("the", 100)))
			}
			return fs
		}},
		{"open on every channel, then records", func(d deployedData) [][]byte {
			var fs [][]byte
			for ch := range uint32(4) {
				fs = append(fs, rawFrame(4, ch, 0, nil), dataFrame(ch, forgedBatch("stolen", 10)))
			}
			return fs
		}},
		{"barriers and ends of stream", func(d deployedData) [][]byte {
			var fs [][]byte
			for ch := range uint32(4) {
				fs = append(fs, dataFrame(ch, barrier), dataFrame(ch, []byte{3}))
			}
			return fs
		}},
		{"frames of 64 MiB on unused channels", func(d deployedData) [][]byte {
			var fs [][]byte
			for ch := range uint32(4) {
				fs = append(fs, rawFrame(1, 1000+ch, 64<<20, make([]byte, 1<<20)))
			}
			return fs
		}},
		{"a malformed 10-byte frame", func(d deployedData) [][]byte {
			var fs [][]byte
			for ch := range uint32(4) {
				fs = append(fs, rawFrame(1, ch, 1, []byte{9}))
			}
			return fs
		}},
	}
	for _, tm := range []string{"tm-a", "tm-b"} {
		for _, a := range attacks {
			for _, hello := range []bool{true, false} { // with a hello as the first protocol had it, and without
				d := dataAddress(t, c.TMs[tm], id) // the latest attempt's, should the job have restarted
				conn, err := net.Dial("tcp", d.Addr)
				if err != nil { // the attempt is over: the attack restarted the job
					t.Errorf("%s: %s: dial %s: %v", tm, a.name, d.Addr, err)
					continue
				}
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				w := bufio.NewWriter(conn)
				if hello {
					_, _ = w.Write(forgedHello(d))
				}
				for _, f := range a.frames(d) {
					_, _ = w.Write(f)
				}
				_ = w.Flush() // refused, the write may fail: what matters is what the job did with it
				// Read what the receiver answers until it closes the
				// connection (or the deadline), so the frames were
				// handled before the next attack.
				_, _ = bufio.NewReader(conn).Discard(1 << 30)
				conn.Close()
				t.Logf("%s: %s (hello %v) sent to attempt %d", tm, a.name, hello, d.Attempt)
			}
		}
	}
	// Two more checkpoints' worth of output after the attack, then the
	// whole output checked record by record.
	c.waitOutput(ctx, "counts", len(committed(t, ctx, c.env.Addr, "counts"))+300)
	in.halt()
	total := c.verify(ctx, "lines", "counts")
	after := c.Status(id)
	if after.Restarts != before.Restarts || after.State != "RUNNING" {
		t.Fatalf("the job restarted after the attack: before %+v, after %+v; %s", before, after, c.Logs(60))
	}
	for _, tm := range []string{"tm-a", "tm-b"} {
		log := c.TMs[tm].Stderr.String()
		if !strings.Contains(log, "data-plane connection refused") {
			t.Errorf("task manager %s logged no refused data-plane connection:\n%s", tm, c.TMs[tm].Stderr.Tail(40))
		}
		if tls && !strings.Contains(log, "does not look like a TLS handshake") { // the plaintext attacker met TLS
			t.Errorf("task manager %s: the data plane did not run TLS:\n%s", tm, c.TMs[tm].Stderr.Tail(40))
		}
	}
	t.Logf("%d lines, %d output records, restarts %d", in.n, total, after.Restarts)
}
