package sessions

import (
	"slices"
	"time"
)

// Expected is the contract's sessions of clicks, computed without the
// runtime: per user, clicks in ts order, a click more than gap after the
// previous one starts a new session (one exactly gap after it joins its
// session: Flink's session windows merge windows that touch, its
// TimeWindow.intersects being inclusive); a session is emitted once the
// watermark (the largest ts minus outOfOrderness minus 1 ms) reaches its
// end - 1. Every click must be on time (none late). Tests compare a job's
// output with it record by record.
func Expected(clicks []Click, gap, outOfOrderness time.Duration) []Session {
	g, ooo := gap.Milliseconds(), outOfOrderness.Milliseconds()
	byUser := map[string][]int64{}
	maxTS := int64(0)
	for _, c := range clicks {
		byUser[c.User] = append(byUser[c.User], c.TS)
		maxTS = max(maxTS, c.TS)
	}
	wm := maxTS - ooo - 1
	var out []Session
	for user, ts := range byUser {
		slices.Sort(ts)
		cur := Session{User: user, Start: ts[0], End: ts[0] + g, Clicks: 1}
		for _, x := range ts[1:] {
			if x > cur.End {
				if cur.End-1 <= wm {
					out = append(out, cur)
				}
				cur = Session{User: user, Start: x}
			}
			cur.End, cur.Clicks = x+g, cur.Clicks+1
		}
		if cur.End-1 <= wm {
			out = append(out, cur)
		}
	}
	return out
}
