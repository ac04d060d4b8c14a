package taskmanager_test

import (
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/weirstream/weir/taskmanager"
)

// freePorts finds two consecutive free ports on 127.0.0.1.
func freePorts(t *testing.T) int {
	t.Helper()
	for range 50 {
		a, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := a.Addr().(*net.TCPAddr).Port
		b, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1))
		a.Close()
		if err == nil {
			b.Close()
			return p
		}
	}
	t.Fatal("no two consecutive free ports")
	return 0
}

// With ListenPorts and AdvertiseHost (streamctl taskmanager --data-ports,
// --data-advertise), each deployment's Exchange listens on the first free
// port of the range and announces the advertised host with that port, so a
// proxy or NAT forwarding the same ports sits between the task managers;
// when the range is full, deploying fails with ErrNoDataPort.
func TestExchangeListensInItsPortRangeAndAnnouncesTheAdvertisedHost(t *testing.T) {
	p := freePorts(t)
	opts := []taskmanager.DataOpt{taskmanager.ListenPorts(p, p+1), taskmanager.AdvertiseHost("127.0.0.2")}
	id := taskmanager.AttemptID{Job: "j", Attempt: 1}
	for i := range 2 {
		x, err := taskmanager.ListenExchange(t.Context(), "127.0.0.1", 8, id, []byte("an attempt secret of 32 bytes..."), opts...)
		if err != nil {
			t.Fatalf("exchange %d: %v", i, err)
		}
		defer x.Close()
		if want := fmt.Sprintf("127.0.0.2:%d", p+i); x.Addr() != want {
			t.Fatalf("exchange %d announces %s, want %s", i, x.Addr(), want)
		}
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", p+i))
		if err != nil {
			t.Fatalf("exchange %d does not listen on port %d of 127.0.0.1: %v", i, p+i, err)
		}
		c.Close()
	}
	if x, err := taskmanager.ListenExchange(t.Context(), "127.0.0.1", 8, id, []byte("an attempt secret of 32 bytes..."), opts...); !errors.Is(err, taskmanager.ErrNoDataPort) {
		if x != nil {
			x.Close()
		}
		t.Fatalf("third exchange on a range of two ports: %v, want ErrNoDataPort", err)
	}
}
