package broker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// Repair is what Start did to a data dir whose previous broker did not stop
// cleanly (Unclean), or the group configs it re-applied after any stop.
type Repair struct {
	// Unclean is true when the previous run on the data dir did not stop
	// cleanly (crash, SIGKILL, power loss).
	Unclean bool
	// SegmentIndexes are the partition segment indexes ("topic-partition/
	// base.idx") rebuilt from their segments before kfake loaded the dir:
	// a kill between kfake's write of a batch and of its index entry had
	// left them short (segindex.go).
	SegmentIndexes []string
	// GroupConfigs are the groups whose journaled configs were re-applied.
	GroupConfigs []string
	// ShareGroups are the share groups whose partition state was rebuilt
	// from the journal.
	ShareGroups []string
	// ShareRecordsRedelivered counts records put back for redelivery (at a
	// delivery count above 1) by the share-state rebuild.
	ShareRecordsRedelivered int64
	// AbortedTxns are the transactions the crash left open (producer id,
	// epoch, partitions), now aborted with markers.
	AbortedTxns []OrphanTxn
	// FencedProducers are the transactional ids whose producers kfake's
	// in-memory epoch bump left unfenced (the fence of an earlier crash's
	// lost transaction was lost by this crash, or the producer's epoch had
	// run ahead of the persisted one), re-initialised so that they cannot
	// continue a lost transaction.
	FencedProducers []string
}

// Repaired returns what Start repaired in the data dir (zero without one).
func (b *Broker) Repaired() Repair { return b.repair }

// repairer keeps the journal up to date while the broker runs.
type repairer struct {
	dir string
	cl  *kgo.Client // through the internal listener
	log *zap.Logger

	mu      sync.Mutex
	j       journal
	written journal
	dirty   map[string]bool // groups whose configs changed, to re-read

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
}

// shareJournalInterval is how often the share-partition start offsets are
// journaled. A crash loses at most what was acknowledged since; those
// records are redelivered (at delivery count > 1), never skipped.
const shareJournalInterval = 200 * time.Millisecond

func newRepairer(dir string, cl *kgo.Client, log *zap.Logger) (*repairer, error) {
	j, err := readJournal(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}
	return &repairer{
		dir: dir, cl: cl, log: log, j: j, written: j.clone(), dirty: map[string]bool{},
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}, nil
}

// install adds the control hooks that journal what kfake does not persist
// as it goes.
func (r *repairer) install(c *kfake.Cluster, autoCreate bool) {
	if autoCreate {
		// A topic auto-created by a metadata request is not written to
		// topics.json: create it first through CreateTopic, which is.
		c.ControlKey(kmsg.Metadata.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			m := req.(*kmsg.MetadataRequest)
			if !m.AllowAutoTopicCreation {
				return nil, nil, false
			}
			for _, t := range m.Topics {
				if t.Topic != nil && *t.Topic != "" {
					// Errors (exists, invalid name) are kfake's to report
					// in its own answer.
					_ = c.CreateTopic(*t.Topic, -1, nil)
				}
			}
			return nil, nil, false
		})
	}
	c.ControlKey(kmsg.IncrementalAlterConfigs.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		a := req.(*kmsg.IncrementalAlterConfigsRequest)
		if a.ValidateOnly {
			return nil, nil, false
		}
		for _, res := range a.Resources {
			if res.ResourceType != kmsg.ConfigResourceTypeGroupConfig {
				continue
			}
			// Journal as requested before kfake applies it, so nothing
			// acknowledged is lost; the journaler re-reads the group's
			// configs afterwards, dropping anything kfake refused.
			r.mu.Lock()
			m := r.j.GroupConfigs[res.ResourceName]
			if m == nil {
				m = map[string]string{}
				r.j.GroupConfigs[res.ResourceName] = m
			}
			for _, cfg := range res.Configs {
				switch {
				case cfg.Op == kmsg.IncrementalAlterConfigOpSet && cfg.Value != nil:
					m[cfg.Name] = *cfg.Value
				case cfg.Op == kmsg.IncrementalAlterConfigOpDelete:
					delete(m, cfg.Name)
				}
			}
			r.dirty[res.ResourceName] = true
			r.mu.Unlock()
		}
		if err := r.flush(); err != nil {
			r.log.Error("embedded broker: cannot journal group configs", zap.Error(err))
		}
		r.poke()
		return nil, nil, false
	})
	c.ControlKey(kmsg.AlterConfigs.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, res := range req.(*kmsg.AlterConfigsRequest).Resources {
			if res.ResourceType == kmsg.ConfigResourceTypeGroupConfig {
				r.mu.Lock()
				r.dirty[res.ResourceName] = true
				r.mu.Unlock()
				r.poke()
			}
		}
		return nil, nil, false
	})
}

func (r *repairer) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// run journals share-partition start offsets every shareJournalInterval and
// re-reads changed group configs, until close.
func (r *repairer) run() {
	defer close(r.done)
	t := time.NewTicker(shareJournalInterval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		case <-r.kick:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		go func() {
			select {
			case <-r.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		err := errors.Join(r.rereadGroupConfigs(ctx), r.observeShareStarts(ctx), r.flush())
		cancel()
		if err != nil && !errors.Is(err, context.Canceled) {
			r.log.Warn("embedded broker: journal update failed (retrying)", zap.Error(err))
		}
	}
}

func (r *repairer) close() {
	close(r.stop)
	<-r.done
}

// flush writes the journal if it changed.
func (r *repairer) flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if journalEqual(r.j, r.written) {
		return nil
	}
	if err := writeJournal(r.dir, r.j); err != nil {
		return err
	}
	r.written = r.j.clone()
	return nil
}

func journalEqual(a, b journal) bool {
	if len(a.GroupConfigs) != len(b.GroupConfigs) || len(a.ShareStart) != len(b.ShareStart) {
		return false
	}
	for g, m := range a.GroupConfigs {
		if !maps.Equal(m, b.GroupConfigs[g]) {
			return false
		}
	}
	for g, ts := range a.ShareStart {
		if len(ts) != len(b.ShareStart[g]) {
			return false
		}
		for t, ps := range ts {
			if !maps.Equal(ps, b.ShareStart[g][t]) {
				return false
			}
		}
	}
	return true
}

// rereadGroupConfigs replaces the journaled configs of changed groups with
// what the broker reports as set on them.
func (r *repairer) rereadGroupConfigs(ctx context.Context) error {
	r.mu.Lock()
	groups := slices.Sorted(maps.Keys(r.dirty))
	clear(r.dirty)
	r.mu.Unlock()
	if len(groups) == 0 {
		return nil
	}
	req := kmsg.NewPtrDescribeConfigsRequest()
	for _, g := range groups {
		res := kmsg.NewDescribeConfigsRequestResource()
		res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, g
		req.Resources = append(req.Resources, res)
	}
	resp, err := req.RequestWith(ctx, r.cl)
	if err != nil {
		r.mu.Lock()
		for _, g := range groups {
			r.dirty[g] = true
		}
		r.mu.Unlock()
		return fmt.Errorf("describe group configs: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, res := range resp.Resources {
		if kerr.ErrorForCode(res.ErrorCode) != nil {
			continue
		}
		m := map[string]string{}
		for _, c := range res.Configs {
			if c.Source == kmsg.ConfigSourceGroupConfig && c.Value != nil {
				m[c.Name] = *c.Value
			}
		}
		if len(m) == 0 {
			delete(r.j.GroupConfigs, res.ResourceName)
		} else {
			r.j.GroupConfigs[res.ResourceName] = m
		}
	}
	return nil
}

// observeShareStarts journals the start offset of every share partition.
func (r *repairer) observeShareStarts(ctx context.Context) error {
	lg := kmsg.NewPtrListGroupsRequest()
	lg.TypesFilter = []string{"share"}
	lresp, err := lg.RequestWith(ctx, r.cl)
	if err != nil {
		return fmt.Errorf("list share groups: %w", err)
	}
	var groups []string
	for _, g := range lresp.Groups {
		groups = append(groups, g.Group)
	}
	if len(groups) == 0 {
		return nil
	}
	described, err := kadm.NewClient(r.cl).DescribeShareGroupOffsets(ctx, groups...)
	if err != nil {
		return fmt.Errorf("describe share group offsets: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for g, d := range described {
		if d.Err != nil {
			continue
		}
		for t, ps := range d.Offsets {
			for p, o := range ps {
				if o.Err != nil || o.StartOffset < 0 {
					continue
				}
				ts := r.j.ShareStart[g]
				if ts == nil {
					ts = map[string]map[int32]int64{}
					r.j.ShareStart[g] = ts
				}
				if ts[t] == nil {
					ts[t] = map[int32]int64{}
				}
				ts[t][p] = o.StartOffset
			}
		}
	}
	return nil
}

// reapplyGroupConfigs sets every journaled group config on the cluster.
// After a clean stop kfake restored them itself; setting them again is a
// no-op.
func (r *repairer) reapplyGroupConfigs(c *kfake.Cluster) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	groups := slices.Sorted(maps.Keys(r.j.GroupConfigs))
	for _, g := range groups {
		c.SetGroupConfigs(g, r.j.GroupConfigs[g])
	}
	return groups
}
