package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// repairShareGroups rebuilds the share-partition state a crash lost: each
// journaled share partition restarts at its journaled start offset
// (AlterShareGroupOffsets, as an administrator resetting the group would),
// and every record from there to the log end is acquired once and released,
// so it comes back at a delivery count above 1. A share consumer treats such
// a record as a redelivery and checks whether it was already processed (the
// source's ack-log lookup) instead of processing it again. The records
// acknowledged since the last journal entry are the ones redelivered;
// nothing is skipped.
//
// Partitions of a journaled group's topics that the journal has no entry for
// restart at the log start if the group resets to earliest, else as kfake
// decides (latest).
func (r *repairer) repairShareGroups(ctx context.Context, lockCap string) (groups []string, redelivered int64, err error) {
	r.mu.Lock()
	starts := r.j.clone()
	r.mu.Unlock()
	adm := kadm.NewClient(r.cl)
	for _, g := range slices.Sorted(maps.Keys(starts.ShareStart)) {
		topics := slices.Sorted(maps.Keys(starts.ShareStart[g]))
		begin, err := adm.ListStartOffsets(ctx, topics...)
		if err != nil {
			return groups, redelivered, fmt.Errorf("share group %s: list start offsets: %w", g, err)
		}
		end, err := adm.ListEndOffsets(ctx, topics...)
		if err != nil {
			return groups, redelivered, fmt.Errorf("share group %s: list end offsets: %w", g, err)
		}
		earliest := starts.GroupConfigs[g]["share.auto.offset.reset"] == "earliest"
		offsets := kadm.Offsets{}
		want := map[string]map[int32]int64{} // partitions to warm: [start, end)
		begin.Each(func(lo kadm.ListedOffset) {
			if lo.Err != nil {
				return
			}
			s, ok := starts.ShareStart[g][lo.Topic][lo.Partition]
			if !ok {
				if !earliest {
					return
				}
				s = lo.Offset
			}
			s = max(s, lo.Offset)
			offsets.Add(kadm.Offset{Topic: lo.Topic, Partition: lo.Partition, At: s, LeaderEpoch: -1})
			if e, ok := end.Lookup(lo.Topic, lo.Partition); ok && e.Err == nil && e.Offset > s {
				if want[lo.Topic] == nil {
					want[lo.Topic] = map[int32]int64{}
				}
				want[lo.Topic][lo.Partition] = e.Offset
			}
		})
		if len(offsets) == 0 {
			continue
		}
		resps, err := adm.AlterShareGroupOffsets(ctx, g, offsets)
		if err != nil {
			return groups, redelivered, fmt.Errorf("share group %s: reset start offsets: %w", g, err)
		}
		for t, ps := range resps {
			for p, perr := range ps {
				if perr != nil {
					return groups, redelivered, fmt.Errorf("share group %s: reset start offset of %s/%d: %w", g, t, p, perr)
				}
			}
		}
		n, err := r.redeliverOnce(ctx, g, topics, want, lockCap)
		redelivered += n
		if err != nil {
			return groups, redelivered, fmt.Errorf("share group %s: %w", g, err)
		}
		groups = append(groups, g)
	}
	return groups, redelivered, nil
}

// redeliverOnce joins group as a repair member, acquires every available
// record of want (up to the given end offsets) and releases them, so each
// counts one delivery. The per-partition lock cap is lifted meanwhile and
// restored to lockCap ("" for kfake's default) after.
func (r *repairer) redeliverOnce(ctx context.Context, group string, topics []string, want map[string]map[int32]int64, lockCap string) (int64, error) {
	if len(want) == 0 {
		return 0, nil
	}
	if err := r.setBrokerConfig(ctx, "group.share.partition.max.record.locks", strconv.Itoa(1<<30)); err != nil {
		return 0, err
	}
	defer func() {
		if err := r.setBrokerConfig(context.WithoutCancel(ctx), "group.share.partition.max.record.locks", lockCap); err != nil {
			r.log.Error("embedded broker: cannot restore group.share.partition.max.record.locks", zap.Error(err))
		}
	}()

	var idb [8]byte
	_, _ = rand.Read(idb[:])
	member := "weir-repair-" + hex.EncodeToString(idb[:]) // at most 36 characters
	hb := kmsg.NewPtrShareGroupHeartbeatRequest()
	hb.GroupID, hb.MemberID, hb.MemberEpoch, hb.SubscribedTopicNames = group, member, 0, topics
	var assigned []kmsg.ShareGroupHeartbeatResponseAssignmentTopicPartition
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := hb.RequestWith(ctx, r.cl)
		if err != nil {
			return 0, fmt.Errorf("repair member join: %w", err)
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			return 0, fmt.Errorf("repair member join: %w", err)
		}
		hb.MemberEpoch, hb.SubscribedTopicNames = resp.MemberEpoch, nil
		if resp.Assignment != nil {
			assigned = resp.Assignment.TopicPartitions
		}
		n := 0
		for _, tp := range assigned {
			n += len(tp.Partitions)
		}
		if n > 0 || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	defer func() {
		leave := kmsg.NewPtrShareGroupHeartbeatRequest()
		leave.GroupID, leave.MemberID, leave.MemberEpoch = group, member, -1
		_, _ = leave.RequestWith(context.WithoutCancel(ctx), r.cl)
	}()

	names := map[[16]byte]string{}
	meta, err := kadm.NewClient(r.cl).ListTopics(ctx, topics...)
	if err != nil {
		return 0, fmt.Errorf("repair member metadata: %w", err)
	}
	for _, td := range meta {
		names[td.ID] = td.Topic
	}
	acquired := map[string]map[int32][][2]int64{}
	var total int64
	epoch := int32(0)
	for round := 0; ; round++ {
		req := kmsg.NewPtrShareFetchRequest()
		req.GroupID, req.MemberID = &group, &member
		req.ShareSessionEpoch = epoch
		req.MaxBytes, req.MaxRecords, req.MaxWaitMillis = 1<<30, 1<<30, 0
		req.ShareAcquireMode = 1 // record limit
		for _, tp := range assigned {
			rt := kmsg.NewShareFetchRequestTopic()
			rt.TopicID = tp.TopicID
			for _, p := range tp.Partitions {
				rp := kmsg.NewShareFetchRequestTopicPartition()
				rp.Partition, rp.PartitionMaxBytes = p, 1<<30
				rt.Partitions = append(rt.Partitions, rp)
			}
			req.Topics = append(req.Topics, rt)
		}
		resp, err := req.RequestWith(ctx, r.cl)
		if err != nil {
			return total, fmt.Errorf("repair fetch: %w", err)
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			return total, fmt.Errorf("repair fetch: %w", err)
		}
		epoch++
		got := int64(0)
		for _, rt := range resp.Topics {
			t := names[rt.TopicID]
			for _, rp := range rt.Partitions {
				for _, a := range rp.AcquiredRecords {
					end, ok := want[t][rp.Partition]
					if !ok || a.FirstOffset >= end {
						continue
					}
					if acquired[t] == nil {
						acquired[t] = map[int32][][2]int64{}
					}
					acquired[t][rp.Partition] = append(acquired[t][rp.Partition], [2]int64{a.FirstOffset, a.LastOffset})
					got += a.LastOffset - a.FirstOffset + 1
				}
			}
		}
		total += got
		if got == 0 || round > 1000 {
			break
		}
	}
	// Release everything acquired, in one request, and close the session.
	ack := kmsg.NewPtrShareAcknowledgeRequest()
	ack.GroupID, ack.MemberID, ack.ShareSessionEpoch = &group, &member, epoch
	for _, tp := range assigned {
		t := names[tp.TopicID]
		if len(acquired[t]) == 0 {
			continue
		}
		at := kmsg.NewShareAcknowledgeRequestTopic()
		at.TopicID = tp.TopicID
		for _, p := range slices.Sorted(maps.Keys(acquired[t])) {
			ap := kmsg.NewShareAcknowledgeRequestTopicPartition()
			ap.Partition = p
			for _, rg := range acquired[t][p] {
				b := kmsg.NewShareAcknowledgeRequestTopicPartitionAcknowledgementBatch()
				b.FirstOffset, b.LastOffset, b.AcknowledgeTypes = rg[0], rg[1], []int8{2} // RELEASE
				ap.AcknowledgementBatches = append(ap.AcknowledgementBatches, b)
			}
			at.Partitions = append(at.Partitions, ap)
		}
		ack.Topics = append(ack.Topics, at)
	}
	if len(ack.Topics) > 0 {
		resp, err := ack.RequestWith(ctx, r.cl)
		if err != nil {
			return total, fmt.Errorf("repair release: %w", err)
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			return total, fmt.Errorf("repair release: %w", err)
		}
		for _, rt := range resp.Topics {
			for _, rp := range rt.Partitions {
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					return total, fmt.Errorf("repair release %s/%d: %w", names[rt.TopicID], rp.Partition, err)
				}
			}
		}
	}
	return total, nil
}

func (r *repairer) setBrokerConfig(ctx context.Context, key, value string) error {
	op := kadm.SetConfig
	var v *string
	if value == "" {
		op = kadm.DeleteConfig
	} else {
		v = &value
	}
	resps, err := kadm.NewClient(r.cl).AlterBrokerConfigs(ctx, []kadm.AlterConfig{{Op: op, Name: key, Value: v}})
	if err == nil {
		for _, rr := range resps {
			if rr.Err != nil {
				err = rr.Err
			}
		}
	}
	if err != nil {
		return fmt.Errorf("set broker config %s=%q: %w", key, value, err)
	}
	return nil
}
