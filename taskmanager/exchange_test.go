package taskmanager_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/taskmanager"
)

// netDeployer deploys each attempt as two task managers' shares
// (runtime.SlotShares), every record between them over the data plane on loopback.
type netDeployer struct {
	job *runtime.Job
	mu  *sync.Mutex
	xs  *[]*taskmanager.Exchange // every attempt's
}

func (n netDeployer) Deploy(ctx context.Context, spec runtime.DeploySpec, rep runtime.TaskReports) (runtime.Deployed, error) {
	shares, _, err := runtime.SlotShares(n.job, 2)
	if err != nil {
		return nil, err
	}
	xs := make([]*taskmanager.Exchange, len(shares))
	addrs := map[checkpoint.TaskID]string{}
	for i, share := range shares {
		if xs[i], err = taskmanager.ListenExchange(ctx, "127.0.0.1", 8, taskmanager.AttemptID{Job: spec.JobID, Attempt: int32(spec.Attempt)}, secret); err != nil {
			for _, x := range xs[:i] {
				_ = x.Close()
			}
			return nil, err
		}
		for _, id := range share {
			addrs[id] = xs[i].Addr()
		}
	}
	n.mu.Lock()
	*n.xs = append(*n.xs, xs...)
	n.mu.Unlock()
	var parts []runtime.Deployed
	for i, x := range xs {
		x.SetPeers(addrs)
		ps := spec
		ps.Tasks = shares[i]
		d, err := taskmanager.Deploy(ctx, n.job, ps, x, rep)
		if err != nil { // Deploy closed x; stop the shares deployed already, close the rest
			for _, p := range parts {
				p.Cancel(false)
				p.Wait()
			}
			for _, x := range xs[i+1:] {
				_ = x.Close()
			}
			return nil, err
		}
		parts = append(parts, d)
	}
	return runtime.Combine(parts...), nil
}

// A keyed count split over two task managers' data planes counts every
// word exactly: records, barriers and the end of stream cross the network.
func TestKeyedCountAcrossTwoDataPlanesCountsEveryWord(t *testing.T) {
	const distinct, n = 37, 5000
	words := make([]string, n)
	for i := range words {
		words[i] = fmt.Sprintf("w%d", i%distinct)
	}
	var mu sync.Mutex
	got := map[string][]int64{}
	job := runtime.NewJob("count", runtime.DefaultParallelism(3))
	src := runtime.FromSource(job, "words", runtime.SliceSource(words, 50), runtime.Parallelism(2))
	ones := runtime.Map(src, "one", func(w string) (wc, error) { return wc{W: w, N: 1}, nil })
	counts := runtime.Reduce(runtime.KeyBy(ones, func(v wc) string { return v.W }, nil), "count",
		func(acc, v wc) (wc, error) { return wc{W: acc.W, N: acc.N + v.N}, nil }, nil)
	runtime.SinkTo(counts, "collect", runtime.SinkFunc(func(_ context.Context, v wc) error {
		mu.Lock()
		got[v.W] = append(got[v.W], v.N)
		mu.Unlock()
		return nil
	}))
	var xs []*taskmanager.Exchange
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, err := runtime.NewMiniCluster(runtime.CheckpointInterval(20*time.Millisecond), runtime.Restarts(0, 0),
		runtime.Deployment(netDeployer{job: job, mu: &mu, xs: &xs})).Run(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	var sent int64
	for _, x := range xs {
		sent += x.Sent()
	}
	if sent == 0 {
		t.Fatal("nothing crossed the data plane")
	}
	for i := 0; i < distinct; i++ {
		w := fmt.Sprintf("w%d", i)
		want := int64(n / distinct)
		if i < n%distinct {
			want++
		}
		seq := got[w]
		if int64(len(seq)) != want {
			t.Fatalf("word %s: %d counts emitted, want %d", w, len(seq), want)
		}
		for j, c := range seq {
			if c != int64(j+1) {
				t.Fatalf("word %s: count #%d is %d, want %d (every count 1..n once, in order)", w, j, c, j+1)
			}
		}
	}
	t.Logf("%d messages over the data plane", sent)
}

type wc struct {
	W string
	N int64
}
