package sharegroup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/weirstream/weir/runtime"
)

// TestAMixedClusterWithABrokerLackingShareAPIsIsRefusedNamingIt: during a
// rolling upgrade to Kafka 4.2 (or in a misconfigured cluster) one broker of
// three lacks the share-group APIs Weir needs. Whichever broker the client
// asks first, the source's Open, NewSession and CheckBrokers (submit) must
// refuse the cluster, unrecoverably, naming the broker and what it lacks:
// records led by that broker could never be fetched or renewed.
func TestAMixedClusterWithABrokerLackingShareAPIsIsRefusedNamingIt(t *testing.T) {
	const old = 2 // the broker that lacks them
	cases := []struct {
		name string
		edit func(keys []kmsg.ApiVersionsResponseApiKey) []kmsg.ApiVersionsResponseApiKey
		want string
	}{
		{"a broker without ShareFetch", func(keys []kmsg.ApiVersionsResponseApiKey) []kmsg.ApiVersionsResponseApiKey {
			var out []kmsg.ApiVersionsResponseApiKey
			for _, k := range keys {
				if k.ApiKey != kmsg.ShareFetch.Int16() {
					out = append(out, k)
				}
			}
			return out
		}, "lacks ShareFetch"},
		{"a broker on Kafka 4.1 (share APIs without lock renewal)", func(keys []kmsg.ApiVersionsResponseApiKey) []kmsg.ApiVersionsResponseApiKey {
			for i, k := range keys {
				if k.ApiKey == kmsg.ShareFetch.Int16() || k.ApiKey == kmsg.ShareAcknowledge.Int16() {
					keys[i].MaxVersion = 1
				}
			}
			return keys
		}, "4.2"},
	}
	entries := []struct {
		name string
		run  func(ctx context.Context, addrs []string) error
	}{
		{"source Open", func(ctx context.Context, addrs []string) error {
			newSrc, err := New(func(r *kgo.Record) (string, error) { return "", nil }, Brokers(addrs...), Topics("in"), Group("g"))
			if err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			s := newSrc()
			defer s.Close()
			return s.Open(ctx, &runtime.OperatorContext{Job: "j", UID: "s", Parallelism: 1, Logger: zap.NewNop()})
		}},
		{"NewSession", func(ctx context.Context, addrs []string) error {
			s, err := NewSession(ctx, Brokers(addrs...), Topics("in"), Group("g"))
			if err == nil {
				s.Close()
			}
			return err
		}},
		{"CheckBrokers", func(ctx context.Context, addrs []string) error { return CheckBrokers(ctx, addrs) }},
	}
	for _, tc := range cases {
		for _, e := range entries {
			t.Run(tc.name+"/"+e.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				defer cancel()
				c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(3, "in"))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				addrs := c.ListenAddrs()
				answer := oldBrokerAnswer(t, ctx, addrs, old, tc.edit)
				c.ControlKey(kmsg.ApiVersions.Int16(), func(kr kmsg.Request) (kmsg.Response, error, bool) {
					c.KeepControl()
					if c.CurrentNode() != old {
						return nil, nil, false
					}
					resp := *answer
					resp.Version = kr.GetVersion()
					return &resp, nil, true
				})
				err = e.run(ctx, addrs)
				if !errors.Is(err, ErrNoShareGroups) || !runtime.IsUnrecoverable(err) {
					t.Fatalf("got %v, want an unrecoverable error wrapping ErrNoShareGroups", err)
				}
				if msg := err.Error(); !strings.Contains(msg, fmt.Sprintf("broker %d", old)) || !strings.Contains(msg, tc.want) {
					t.Fatalf("got %q, want it to name broker %d and say %q", msg, old, tc.want)
				}
				for _, other := range []string{"broker 0", "broker 1"} {
					if strings.Contains(err.Error(), other) {
						t.Fatalf("got %q: it blames %s, which supports share groups", err, other)
					}
				}
			})
		}
	}
}

// oldBrokerAnswer returns broker node's real ApiVersions answer with its
// keys edited.
func oldBrokerAnswer(t *testing.T, ctx context.Context, addrs []string, node int32,
	edit func([]kmsg.ApiVersionsResponseApiKey) []kmsg.ApiVersionsResponseApiKey,
) *kmsg.ApiVersionsResponse {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	vs, err := kadm.NewClient(cl).ApiVersions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v, ok := vs[node]
	if !ok || v.Err != nil {
		t.Fatalf("ApiVersions of broker %d: %v (present %v)", node, v.Err, ok)
	}
	resp := *v.Raw()
	resp.ApiKeys = edit(append([]kmsg.ApiVersionsResponseApiKey(nil), resp.ApiKeys...))
	return &resp
}
