package sharegroup_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/sources/sharegroup"
)

// A MirrorMaker-style loop, exactly once: read a share group, write each
// record upper-cased to another topic, and commit the outputs together with
// the acknowledgement of the records they came from. An in-process broker
// stands in for a Kafka cluster.
func ExampleSession() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	b, err := broker.Start(ctx, broker.Config("group.share.heartbeat.interval.ms", "200"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopics(ctx, 1, 1, nil, "lines", "shouted"); err != nil {
		fmt.Println(err)
		return
	}
	for _, line := range []string{"hello", "exactly", "once"} {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "lines", Value: []byte(line)}).FirstErr(); err != nil {
			fmt.Println(err)
			return
		}
	}

	s, err := sharegroup.NewSession(ctx,
		sharegroup.Brokers(b.Addr()),
		sharegroup.Group("shouter"),
		sharegroup.Topics("lines"),
		sharegroup.TransactionalID("shouter-1"),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()

	for done := 0; done < 3; {
		recs, err := s.Poll(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, r := range recs {
			out := &kgo.Record{Topic: "shouted", Value: []byte(strings.ToUpper(string(r.Value)))}
			if err := s.Produce(ctx, out); err != nil {
				fmt.Println(err)
				return
			}
		}
		switch err := s.Commit(ctx); {
		case err == nil:
			done += len(recs)
		case errors.Is(err, sharegroup.ErrConflict):
			// Another session processed these records: nothing of ours is
			// visible; poll again.
		default:
			fmt.Println(err)
			return
		}
	}

	out, err := kafkatest.ReadCommitted(ctx, []string{b.Addr()}, "shouted")
	if err != nil {
		fmt.Println(err)
		return
	}
	var vals []string
	for _, r := range out {
		vals = append(vals, string(r.Value))
	}
	slices.Sort(vals)
	fmt.Println(strings.Join(vals, " "))
	// Output: EXACTLY HELLO ONCE
}
