package sessions

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Generate returns clicks of users for tests and benchmarks, deterministic
// for a seed, in production order: each user clicks every 0.5-15 s from a
// random start in the first minute after start (epoch ms), with a pause of
// 31-120 s (a new session at the default gap) one time in seven, until
// start+span: about 74 clicks per user over 20 minutes. Production order is
// event-time order with up to jitter of disorder (keep it under the job's
// out-of-orderness bound for a run with no late click).
func Generate(users int, start int64, span, jitter time.Duration, seed uint64) []Click {
	rng := rand.New(rand.NewPCG(seed, seed^0x5e55))
	type sortable struct {
		c     Click
		order int64
	}
	var cs []sortable
	for u := range users {
		user := "u" + strconv.Itoa(u)
		for ts := start + rng.Int64N(60_000); ts < start+span.Milliseconds(); {
			cs = append(cs, sortable{Click{User: user, TS: ts}, ts + rng.Int64N(max(1, jitter.Milliseconds()))})
			if rng.IntN(7) == 0 {
				ts += 31_000 + rng.Int64N(89_000)
			} else {
				ts += 500 + rng.Int64N(14_500)
			}
		}
	}
	slices.SortStableFunc(cs, func(a, b sortable) int { return cmp.Compare(a.order, b.order) })
	out := make([]Click, len(cs))
	for i, s := range cs {
		out[i] = s.c
	}
	return out
}

// Record is c as an input record of topic: key the user, value the click's
// JSON ({"user","ts","url"}).
func (c Click) Record(topic string) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: []byte(c.User),
		Value: fmt.Appendf(nil, `{"user":%q,"ts":%d,"url":"/p/%d"}`, c.User, c.TS, c.TS%97)}
}
