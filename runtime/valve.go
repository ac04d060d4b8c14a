package runtime

// markKind is what a watermark-valve action (or an envelope's mark) carries.
type markKind uint8

const (
	markWatermark markKind = iota + 1 // a watermark (ts)
	markIdle                          // the sender is idle: leave it out of the minimum
	markActive                        // the sender is active again
)

func (k markKind) String() string {
	switch k {
	case markWatermark:
		return "watermark"
	case markIdle:
		return "idle"
	case markActive:
		return "active"
	}
	return "?"
}

// valveAction is what the task must forward after feeding its valve an
// event: a new input watermark, or a change of its input status.
type valveAction struct {
	Kind markKind
	TS   int64 // markWatermark
}

// valveChannel is what the valve knows of one input channel.
type valveChannel struct {
	wm    int64
	idle  bool
	ended bool
	// aligned: active, and its watermark is at or past the valve's output,
	// so it takes part in the minimum. A channel that comes back from
	// idleness behind the output is left out until it catches up (as in
	// Flink's StatusWatermarkValve): the output never moves back, and a
	// channel that was idle does not stall the others.
	aligned bool
}

// watermarkValve computes a task's input watermark and status from those of
// its input channels, as a pure state machine: events in (a watermark, idle,
// active or the end of a channel), actions out (emit a watermark, idle or
// active). It holds no channels and no clock; the task loop executes the
// actions.
//
// The input watermark is the minimum over the aligned channels (active, not
// ended, not behind the output); it never moves back. When every channel
// left is idle, the valve first emits the largest watermark any of them
// reached (nothing waits for an idle input), then idle; the first channel
// to become active again makes it emit active.
type watermarkValve struct {
	chans []valveChannel
	out   int64 // last emitted watermark
	idle  bool  // last emitted status
}

func newWatermarkValve(channels int) *watermarkValve {
	v := &watermarkValve{chans: make([]valveChannel, channels), out: MinWatermark}
	for i := range v.chans {
		v.chans[i] = valveChannel{wm: MinWatermark, aligned: true}
	}
	return v
}

// watermark feeds watermark ts received on channel ch. A watermark from an
// idle channel makes it active first.
func (v *watermarkValve) watermark(ch int, ts int64) []valveAction {
	c := &v.chans[ch]
	if c.ended {
		return nil
	}
	var acts []valveAction
	if c.idle {
		acts = v.active(ch)
	}
	if ts <= c.wm {
		return acts
	}
	c.wm = ts
	if !c.aligned && c.wm >= v.out {
		c.aligned = true
	}
	return append(acts, v.advance()...)
}

// idle feeds channel ch announcing it is idle.
func (v *watermarkValve) idleChannel(ch int) []valveAction {
	c := &v.chans[ch]
	if c.ended || c.idle {
		return nil
	}
	c.idle, c.aligned = true, false
	return v.settle()
}

// active feeds channel ch announcing it is active again.
func (v *watermarkValve) active(ch int) []valveAction {
	c := &v.chans[ch]
	if c.ended || !c.idle {
		return nil
	}
	c.idle = false
	c.aligned = c.wm >= v.out
	if v.idle {
		v.idle = false
		return []valveAction{{Kind: markActive}}
	}
	return nil
}

// ended feeds the end of channel ch: it no longer holds anything back.
func (v *watermarkValve) ended(ch int) []valveAction {
	c := &v.chans[ch]
	if c.ended {
		return nil
	}
	c.ended, c.aligned = true, false
	return v.settle()
}

// settle re-evaluates after a channel left the minimum: every channel left
// idle makes the valve idle (after the largest watermark among them);
// otherwise the minimum over the others may advance.
func (v *watermarkValve) settle() []valveAction {
	live, allIdle := 0, true
	maxWM := MinWatermark
	for _, c := range v.chans {
		if c.ended {
			continue
		}
		live++
		if !c.idle {
			allIdle = false
		}
		maxWM = max(maxWM, c.wm)
	}
	if live == 0 {
		return nil
	}
	if !allIdle {
		return v.advance()
	}
	var acts []valveAction
	if maxWM > v.out {
		v.out = maxWM
		acts = append(acts, valveAction{Kind: markWatermark, TS: maxWM})
	}
	if !v.idle {
		v.idle = true
		acts = append(acts, valveAction{Kind: markIdle})
	}
	return acts
}

// advance emits the minimum over the aligned channels if it moved forward.
func (v *watermarkValve) advance() []valveAction {
	lowest, any := MaxWatermark, false
	for _, c := range v.chans {
		if c.aligned && !c.idle && !c.ended {
			lowest, any = min(lowest, c.wm), true
		}
	}
	if !any || lowest <= v.out {
		return nil
	}
	v.out = lowest
	for i := range v.chans {
		c := &v.chans[i]
		if !c.idle && !c.ended && !c.aligned && c.wm >= v.out {
			c.aligned = true
		}
	}
	return []valveAction{{Kind: markWatermark, TS: lowest}}
}
