package rpc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/weirstream/weir/internal/rpc/weirpb"
)

// ErrNoLeader is wrapped by JobManagers.Leader's error when none of the job
// managers leads (an election in progress, or none reachable).
var ErrNoLeader = errors.New("no job manager leads")

// leaderAskTimeout bounds one Leader call while finding the leader.
const leaderAskTimeout = 3 * time.Second

// JobManagers are connections to the job managers of one cluster: one
// (standalone) or several (high availability), of which one leads.
type JobManagers struct {
	addrs []string
	opts  []DialOpt

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	last  string // the last leader found
}

// DialAll returns connections to the job managers addrs lists
// (comma-separated), made lazily as Dial makes them.
func DialAll(addrs string, opts ...DialOpt) (*JobManagers, error) {
	var list []string
	for _, a := range strings.Split(addrs, ",") {
		if a = strings.TrimSpace(a); a != "" && !slices.Contains(list, a) {
			list = append(list, a)
		}
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("%w: no address", ErrUnreachable)
	}
	return &JobManagers{addrs: list, opts: opts, conns: map[string]*grpc.ClientConn{}}, nil
}

// Addrs are the job managers' addresses.
func (j *JobManagers) Addrs() []string { return slices.Clone(j.addrs) }

func (j *JobManagers) client(addr string) (weirpb.JobManagerClient, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	cc := j.conns[addr]
	if cc == nil {
		var err error
		if cc, err = Dial(addr, j.opts...); err != nil {
			return nil, err
		}
		j.conns[addr] = cc
	}
	return weirpb.NewJobManagerClient(cc), nil
}

// Leader returns the address and a client of the job manager that leads.
// With a single address it returns that one without asking (a standalone
// job manager, or one the caller trusts to lead); with several it asks each
// (the Leader call, the last leader found first) and follows a standby's
// answer to the leader, which may be an address not in the list.
func (j *JobManagers) Leader(ctx context.Context) (string, weirpb.JobManagerClient, error) {
	if len(j.addrs) == 1 {
		c, err := j.client(j.addrs[0])
		return j.addrs[0], c, err
	}
	j.mu.Lock()
	order := slices.Clone(j.addrs)
	if i := slices.Index(order, j.last); i > 0 {
		order = append(append([]string{j.last}, order[:i]...), order[i+1:]...)
	}
	j.mu.Unlock()
	var errs []error
	hint := ""
	ask := func(addr string) (bool, error) {
		c, err := j.client(addr)
		if err != nil {
			return false, err
		}
		actx, cancel := context.WithTimeout(ctx, leaderAskTimeout)
		defer cancel()
		info, err := c.Leader(actx, &weirpb.LeaderRequest{})
		if err != nil {
			return false, fmt.Errorf("%s: %w", addr, err)
		}
		if !info.Leading && hint == "" {
			hint = info.LeaderAddress
		}
		return info.Leading, nil
	}
	for _, addr := range order {
		ok, err := ask(addr)
		if ok {
			return j.found(addr)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if hint != "" && !slices.Contains(order, hint) {
		if ok, err := ask(hint); ok {
			return j.found(hint)
		} else if err != nil {
			errs = append(errs, err)
		}
	}
	return "", nil, fmt.Errorf("%w among %s: %w", ErrNoLeader, strings.Join(j.addrs, ","), errors.Join(errs...))
}

func (j *JobManagers) found(addr string) (string, weirpb.JobManagerClient, error) {
	c, err := j.client(addr)
	if err != nil {
		return "", nil, err
	}
	j.mu.Lock()
	j.last = addr
	j.mu.Unlock()
	return addr, c, nil
}

// Close closes every connection.
func (j *JobManagers) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	var errs []error
	for _, cc := range j.conns {
		errs = append(errs, cc.Close())
	}
	clear(j.conns)
	return errors.Join(errs...)
}

// WaitLeading waits until the job manager at addr says it leads (the
// Leader call), or ctx ends.
func WaitLeading(ctx context.Context, addr string, opts ...DialOpt) error {
	cc, err := Dial(addr, opts...)
	if err != nil {
		return err
	}
	defer cc.Close()
	c := weirpb.NewJobManagerClient(cc)
	for {
		actx, cancel := context.WithTimeout(ctx, leaderAskTimeout)
		info, err := c.Leader(actx, &weirpb.LeaderRequest{})
		cancel()
		if err == nil && info.Leading {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("job manager %s does not lead: %w (last answer: %v)", addr, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
