package weirtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/broker/brokerproc"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/internal/proctest"
)

// Kafka is Weir's embedded Kafka broker (the one behind `streamctl
// broker`), running in the test process on a free loopback port, its data
// in a directory of its own so that it can restart with everything it
// holds. It speaks the real Kafka protocol: share groups, transactions,
// read_committed. Close it when the test ends.
type Kafka struct {
	mu      sync.Mutex
	b       *broker.Broker // in process
	child   *brokerChild   // in a child process (BrokerInChildProcess)
	inChild bool
	addr    string
	dir     string
	ownDir  bool
	opts    []broker.Opt
	configs []string // key=value, for a child
}

// KafkaOpt configures StartKafka.
type KafkaOpt interface{ applyKafka(*kafkaCfg) }

type kafkaCfg struct {
	dir        string
	partitions int
	configs    [][2]string
	child      bool
}

type kafkaOpt func(*kafkaCfg)

func (o kafkaOpt) applyKafka(c *kafkaCfg) { o(c) }

// BrokerConfig sets one broker config (as `streamctl broker --config
// key=value`), e.g. group.share.record.lock.duration.ms.
func BrokerConfig(key, value string) KafkaOpt {
	return kafkaOpt(func(c *kafkaCfg) { c.configs = append(c.configs, [2]string{key, value}) })
}

// DefaultPartitions sets the partition count of topics created without one
// (default 8, as `streamctl broker`).
func DefaultPartitions(n int) KafkaOpt { return kafkaOpt(func(c *kafkaCfg) { c.partitions = n }) }

// KafkaDataDir keeps the broker's data in dir (default: a temporary
// directory Close removes).
func KafkaDataDir(dir string) KafkaOpt { return kafkaOpt(func(c *kafkaCfg) { c.dir = dir }) }

// BrokerInChildProcess runs the broker in a child process (the test
// binary itself, started again) instead of the test's own, so that
// KillBroker can SIGKILL it as a crash would. The test package's TestMain
// must call Main first. DefaultPartitions does not apply to it.
func BrokerInChildProcess() KafkaOpt { return kafkaOpt(func(c *kafkaCfg) { c.child = true }) }

// Main runs the embedded broker and exits, if this process is the child
// process of a Kafka started with BrokerInChildProcess; otherwise it
// returns at once. Call it first in the TestMain of a package whose tests
// use BrokerInChildProcess.
func Main() { brokerproc.Main() }

// StartKafka starts the embedded broker and returns once it accepts
// connections.
func StartKafka(ctx context.Context, opts ...KafkaOpt) (*Kafka, error) {
	var c kafkaCfg
	for _, o := range opts {
		o.applyKafka(&c)
	}
	if c.child && c.partitions > 0 {
		return nil, fmt.Errorf("weirtest: DefaultPartitions does not apply to a broker in a child process")
	}
	k := &Kafka{dir: c.dir, inChild: c.child}
	if k.dir == "" {
		dir, err := os.MkdirTemp("", "weirtest-kafka-")
		if err != nil {
			return nil, fmt.Errorf("weirtest: broker data dir: %w", err)
		}
		k.dir, k.ownDir = dir, true
	}
	k.opts = append(k.opts, broker.DataDir(k.dir))
	if c.partitions > 0 {
		k.opts = append(k.opts, broker.Partitions(c.partitions))
	}
	for _, kv := range c.configs {
		k.opts = append(k.opts, broker.Config(kv[0], kv[1]))
		k.configs = append(k.configs, kv[0]+"="+kv[1])
	}
	if k.inChild {
		child, addr, err := startChild(ctx, k.dir, "127.0.0.1:0", k.configs)
		if err != nil {
			k.removeDir()
			return nil, err
		}
		k.child, k.addr = child, addr
		return k, nil
	}
	b, err := broker.Start(ctx, append([]broker.Opt{broker.Listen("127.0.0.1:0")}, k.opts...)...)
	if err != nil {
		k.removeDir()
		return nil, fmt.Errorf("weirtest: start broker: %w", err)
	}
	k.b, k.addr = b, b.Addr()
	return k, nil
}

func (k *Kafka) removeDir() {
	if k.ownDir {
		_ = os.RemoveAll(k.dir)
	}
}

// Addr is the broker's host:port, the bootstrap address of clients and
// of the jobs under test (their "brokers" parameter).
func (k *Kafka) Addr() string { return k.addr }

// Seeds is Addr as a seed list.
func (k *Kafka) Seeds() []string { return []string{k.addr} }

// Close stops the broker and removes its data unless KafkaDataDir gave
// the directory.
func (k *Kafka) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	var err error
	if k.b != nil {
		err = k.b.Close()
		k.b = nil
	}
	if k.child != nil {
		err = k.child.stop()
		k.child = nil
	}
	k.removeDir()
	return err
}

// RestartBroker stops the broker and starts it again on the same address
// and data directory, as an operator restarts one: clients (the running
// job's too) lose their connections and reconnect; records, topics,
// groups, share-group state and open transactions survive. The stop is a
// clean one (the broker writes what it holds); it returns once the broker
// accepts connections again.
func (k *Kafka) RestartBroker(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.inChild {
		if k.child == nil {
			return fmt.Errorf("weirtest: restart broker: it is closed")
		}
		if err := k.child.stop(); err != nil {
			return err
		}
		return k.startChildAgain(ctx)
	}
	if k.b == nil {
		return fmt.Errorf("weirtest: restart broker: it is closed")
	}
	if err := k.b.Close(); err != nil {
		return fmt.Errorf("weirtest: stop broker: %w", err)
	}
	k.b = nil
	b, err := broker.Start(ctx, append([]broker.Opt{broker.Listen(k.addr)}, k.opts...)...)
	if err != nil {
		return fmt.Errorf("weirtest: start broker again: %w", err)
	}
	k.b = b
	return nil
}

// KillBroker SIGKILLs the broker's process, as a crash kills it, and
// starts it again on the same address and data directory: what survives
// is what the broker wrote as it went (records, topics, producer ids), and
// its start repairs what a crash loses (share-group state, group configs,
// transactions left open: see the embedded broker's guide). Clients
// reconnect. It needs BrokerInChildProcess.
func (k *Kafka) KillBroker(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.inChild {
		return fmt.Errorf("weirtest: kill broker: it runs in the test's process; start it with BrokerInChildProcess")
	}
	if k.child == nil {
		return fmt.Errorf("weirtest: kill broker: it is closed")
	}
	k.child.kill()
	return k.startChildAgain(ctx)
}

func (k *Kafka) startChildAgain(ctx context.Context) error {
	k.child = nil
	child, _, err := startChild(ctx, k.dir, k.addr, k.configs)
	if err != nil {
		return err
	}
	k.child = child
	return nil
}

// brokerChild is the broker's child process.
type brokerChild struct {
	cmd    *exec.Cmd
	done   chan struct{} // closed once it exited
	stderr proctest.Buffer
}

var listeningLine = regexp.MustCompile(`^broker listening on (\S+)$`)

// startChild starts the broker process and returns once it listens.
func startChild(ctx context.Context, dir, listen string, configs []string) (*brokerChild, string, error) {
	c := &brokerChild{cmd: brokerproc.Command(dir, listen, configs...), done: make(chan struct{})}
	c.cmd.Stderr = &c.stderr
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("weirtest: start the broker process: %w", err)
	}
	addr := make(chan string, 1)
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(out)
		for first := true; sc.Scan(); first = false {
			if m := listeningLine.FindStringSubmatch(sc.Text()); first && m != nil {
				addr <- m[1]
			}
		}
		_ = c.cmd.Wait()
	}()
	select {
	case a := <-addr:
		return c, a, nil
	case <-c.done:
		return nil, "", fmt.Errorf("weirtest: the broker process exited (%v) before it listened (did TestMain call weirtest.Main?): %s",
			c.cmd.ProcessState, c.stderr.Tail(20))
	case <-ctx.Done():
		c.kill()
		return nil, "", fmt.Errorf("weirtest: start the broker process: %w", ctx.Err())
	}
}

// kill SIGKILLs the process and waits for it to exit.
func (c *brokerChild) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// stop stops the process cleanly (SIGTERM: the broker writes what it
// holds), or kills it after a minute.
func (c *brokerChild) stop() error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(time.Minute)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
		c.kill()
		return errors.New("weirtest: the broker process did not stop within a minute of SIGTERM; killed")
	}
	if code := c.cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("weirtest: the broker process exited %d at its stop: %s", code, c.stderr.Tail(20))
	}
	return nil
}

// Client returns a new kgo client seeded with the broker (close it).
func (k *Kafka) Client(opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(k.addr)}, opts...)...)
}

// CreateTopic creates topic with the given partitions (-1: the broker's
// default) and configs (nil: none).
func (k *Kafka) CreateTopic(ctx context.Context, topic string, partitions int32, configs map[string]*string) error {
	cl, err := k.Client()
	if err != nil {
		return err
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, 1, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return fmt.Errorf("weirtest: create topic %q: %w", topic, err)
	}
	return nil
}

// Produce writes recs to topic (a record's own Topic, if set, wins) and
// returns once the broker acknowledged every one.
func (k *Kafka) Produce(ctx context.Context, topic string, recs ...*kgo.Record) error {
	cl, err := k.Client(kgo.DefaultProduceTopic(topic))
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("weirtest: produce to %q: %w", topic, err)
	}
	return nil
}

// ProduceValues writes one record per value, without key, to topic.
func (k *Kafka) ProduceValues(ctx context.Context, topic string, values ...string) error {
	recs := make([]*kgo.Record, len(values))
	for i, v := range values {
		recs[i] = &kgo.Record{Value: []byte(v)}
	}
	return k.Produce(ctx, topic, recs...)
}

// ProduceTxn writes recs to topic in one transaction of transactional id
// txnID and commits it, or aborts it when commit is false: a
// read_committed reader (a Weir source among them) never sees an aborted
// transaction's records.
func (k *Kafka) ProduceTxn(ctx context.Context, txnID string, commit bool, topic string, recs ...*kgo.Record) error {
	return kafkatest.WriteTxn(ctx, k.Seeds(), txnID, commit, withTopic(topic, recs)...)
}

// Txn is a transaction of input left open (BeginTxn).
type Txn struct{ x *kafkatest.Txn }

// BeginTxn writes recs to topic in a transaction of transactional id txnID
// and leaves it open: read_committed readers stop at its first record on
// each partition until End.
func (k *Kafka) BeginTxn(ctx context.Context, txnID, topic string, recs ...*kgo.Record) (*Txn, error) {
	x, err := kafkatest.BeginTxn(ctx, k.Seeds(), txnID, withTopic(topic, recs)...)
	if err != nil {
		return nil, err
	}
	return &Txn{x}, nil
}

// End commits (commit) or aborts the transaction.
func (x *Txn) End(ctx context.Context, commit bool) error { return x.x.End(ctx, commit) }

func withTopic(topic string, recs []*kgo.Record) []*kgo.Record {
	for _, r := range recs {
		if r.Topic == "" {
			r.Topic = topic
		}
	}
	return recs
}

// ReadCommitted returns every record of topic a read_committed consumer
// sees when the call starts, in partition order, then offset order (a
// key's records are in offset order when the topic is partitioned by
// key): exactly the output a job committed.
func (k *Kafka) ReadCommitted(ctx context.Context, topic string) ([]*kgo.Record, error) {
	return kafkatest.ReadCommitted(ctx, k.Seeds(), topic)
}

// Unfinished lists what the broker still holds open: transactions not
// ended (ongoing, or preparing their commit or abort), and the partitions
// of topics whose last stable offset is below their high watermark (a
// read_committed reader does not see all of them yet). A job stopped for
// good (RunningJob.Stop) leaves nothing open.
func (k *Kafka) Unfinished(ctx context.Context, topics ...string) ([]string, error) {
	cl, err := k.Client()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	return kafkatest.Unfinished(ctx, kadm.NewClient(cl), topics...)
}
