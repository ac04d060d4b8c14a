package jobmanager_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/jobmanager"
)

// tmList is GET /taskmanagers as the test reads it.
type tmList struct {
	TaskManagers []struct {
		ID         string `json:"id"`
		State      string `json:"state"`
		FreeSlots  int    `json:"freeSlots"`
		LostAt     int64  `json:"lost_at"`
		LostReason string `json:"lost_reason"`
	} `json:"taskmanagers"`
}

func getTaskManagers(t *testing.T, hs *httptest.Server) tmList {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, hs.URL+"/taskmanagers", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /taskmanagers: %d %s %v", resp.StatusCode, b, err)
	}
	var l tmList
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatalf("GET /taskmanagers: %v: %s", err, b)
	}
	return l
}

// A task manager whose connection ends is listed by GET /taskmanagers as
// LOST, with when and why, no free slots, rather than dropped; once it
// registers again it is listed once, REGISTERED.
func TestALostTaskManagerIsListedAsLostUntilItRegistersAgain(t *testing.T) {
	s, err := jobmanager.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	addr, _ := serve(t, s)
	hs := httptest.NewServer(s.HTTPHandler())
	t.Cleanup(hs.Close)

	register(t, addr, "tm-stays", 1)
	cc, err := rpc.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithCancel(t.Context())
	st, err := weirpb.NewJobManagerClient(cc).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Register{Register: &weirpb.Register{
		TaskManagerId: "tm-goes", Slots: 2, DataHost: "127.0.0.1"}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "two task managers", func(tms []jobmanager.TaskManager) bool { return len(tms) == 2 })
	cancel() // the connection ends without a goodbye
	waitFor(t, s, "the loss", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })

	got := getTaskManagers(t, hs)
	states := map[string]string{}
	for _, tm := range got.TaskManagers {
		states[tm.ID] = tm.State
		if tm.ID == "tm-goes" && (tm.LostAt == 0 || !strings.Contains(tm.LostReason, "tm-goes") || tm.FreeSlots != 0) {
			t.Errorf("lost task manager %+v: want when, why and no free slots", tm)
		}
	}
	if len(got.TaskManagers) != 2 || states["tm-stays"] != "REGISTERED" || states["tm-goes"] != "LOST" {
		t.Fatalf("GET /taskmanagers: %+v, want tm-stays REGISTERED and tm-goes LOST", got)
	}

	register(t, addr, "tm-goes", 2)
	waitFor(t, s, "the return", func(tms []jobmanager.TaskManager) bool { return len(tms) == 2 })
	got = getTaskManagers(t, hs)
	if len(got.TaskManagers) != 2 || got.TaskManagers[0].State != "REGISTERED" || got.TaskManagers[1].State != "REGISTERED" {
		t.Errorf("GET /taskmanagers after tm-goes registered again: %+v, want both REGISTERED, once each", got)
	}
}
