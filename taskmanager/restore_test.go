package taskmanager_test

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/taskmanager"
)

// deployJM registers a task manager, sends it one deployment whose
// restored state is restore (in chunks, passed through tamper, when above
// one chunk), and hands on the task manager's Prepared.
type deployJM struct {
	weirpb.UnimplementedJobManagerServer
	restore  []byte
	tamper   func([]*weirpb.Chunk)
	prepared chan *weirpb.Prepared
}

func (f *deployJM) Connect(s grpc.BidiStreamingServer[weirpb.TaskManagerMessage, weirpb.JobManagerMessage]) error {
	if _, err := s.Recv(); err != nil {
		return nil
	}
	if err := s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Registered{Registered: &weirpb.Registered{
		Session: 1, HeartbeatIntervalMs: 50, HeartbeatTimeoutMs: 30_000}}}); err != nil {
		return err
	}
	dt := &weirpb.DeployTasks{JobId: "j", JobType: "numbers", Attempt: 1, TaskIds: []string{"numbers#0"}, DataSecret: secret}
	hdr, chunks := rpc.NewChunker(rpc.DefaultChunkSize).Split(f.restore)
	if hdr == nil {
		dt.Restore = f.restore
	} else {
		dt.RestoreChunked = hdr
		if f.tamper != nil {
			f.tamper(chunks)
		}
	}
	if err := s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Deploy{Deploy: dt}}); err != nil {
		return err
	}
	for _, c := range chunks {
		if err := s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Chunk{Chunk: c}}); err != nil {
			return err
		}
	}
	for {
		m, err := s.Recv()
		if err != nil {
			return nil
		}
		if p := m.GetPrepared(); p != nil {
			f.prepared <- p
		}
	}
}

// A deployment's restored state arrives whole even when it is far larger
// than one message (in chunks); a payload broken in transit fails the
// deployment saying so, and a restored state that cannot be decoded fails
// it as unrecoverable: every restart would send the same bytes.
func TestRestoredStateArrivesInChunksOrFailsTheDeploymentWithItsCause(t *testing.T) {
	// 6 MiB of restored state: more than a message may hold.
	big, err := json.Marshal(&runtime.StateAssignment{From: 3, NonRestored: []string{strings.Repeat("u", 6<<20)}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		restore       []byte
		tamper        func([]*weirpb.Chunk)
		want          string // in Prepared.error; "" for none
		unrecoverable bool
	}{
		{name: "large state in chunks", restore: big},
		{name: "corrupt chunk", restore: big, tamper: func(chs []*weirpb.Chunk) {
			d := append([]byte(nil), chs[3].Data...)
			d[100] ^= 1
			chs[3] = &weirpb.Chunk{Transfer: chs[3].Transfer, Seq: chs[3].Seq, Data: d}
		}, want: "checksum"},
		{name: "state that cannot be decoded", restore: []byte(`{"From":`), want: "restored state", unrecoverable: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := runtime.NewRegistry()
			if err := reg.Register(runtime.JobType{Name: "numbers", Build: func(runtime.Params) (*runtime.Job, error) {
				job := runtime.NewJob("numbers", runtime.DefaultParallelism(1))
				nums := runtime.FromSource(job, "numbers", runtime.SliceSource([]int{1, 2, 3}, 0))
				runtime.SinkTo(nums, "discard", runtime.SinkFunc(func(context.Context, int) error { return nil }))
				return job, nil
			}}); err != nil {
				t.Fatal(err)
			}
			f := &deployJM{restore: tc.restore, tamper: tc.tamper, prepared: make(chan *weirpb.Prepared, 1)}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			gs := grpc.NewServer()
			weirpb.RegisterJobManagerServer(gs, f)
			go func() { _ = gs.Serve(lis) }()
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- taskmanager.Run(ctx, lis.Addr().String(), taskmanager.Jobs(reg), taskmanager.Slots(1)) }()
			t.Cleanup(func() {
				cancel()
				<-done
				gs.Stop()
			})
			var p *weirpb.Prepared
			select {
			case p = <-f.prepared:
			case <-time.After(60 * time.Second):
				t.Fatal("no Prepared within 60s")
			}
			switch {
			case tc.want == "" && p.Error != "":
				t.Fatalf("deployment failed: %s", p.Error)
			case tc.want != "" && !strings.Contains(p.Error, tc.want):
				t.Fatalf("Prepared error %q; want it to say %q", p.Error, tc.want)
			case p.Unrecoverable != tc.unrecoverable:
				t.Fatalf("Prepared unrecoverable = %v, want %v (error %q)", p.Unrecoverable, tc.unrecoverable, p.Error)
			}
		})
	}
}
