package cli

import (
	"go.uber.org/zap/zapcore"
)

// chatter reports whether a log entry's component is a library whose routine
// messages streamctl shows only at debug level: an INFO entry of pebble
// ("Found 0 WALs" and the like, logged at INFO through the checkpoint
// store's adapter) is written as DEBUG, or dropped when DEBUG is off.
// Warnings and errors pass unchanged. (The embedded broker already logs
// kfake's routine messages at DEBUG.)
func chatter(component string) bool { return component == "pebble" }

// cliCore wraps the core streamctl writes its logs with and fixes two things
// no single package can, because they come from how loggers are combined:
//
//   - A field key already set (by With, or earlier in the same entry) is not
//     written again: a logger scoped with subtask=1 handed to a library that
//     adds subtask=1 itself would otherwise print "subtask" twice in one JSON
//     object. The first value wins.
//   - Third-party chatter (see chatter) stays below INFO.
//
// (ISO 8601 timestamps are the encoder's part: newEncoder.)
//
// Keys inside a zap.Namespace are nested objects and are not compared.
type cliCore struct {
	zapcore.Core
	// keys set by With on this core, and whether a Namespace was opened
	// (after which keys are nested and no longer deduplicated). Never
	// mutated after construction: With copies.
	keys      map[string]bool
	nested    bool
	component string // the "component" string field set by With, if any
}

func newCLICore(c zapcore.Core) zapcore.Core { return &cliCore{Core: c, keys: map[string]bool{}} }

func (c *cliCore) With(fields []zapcore.Field) zapcore.Core {
	n := &cliCore{keys: make(map[string]bool, len(c.keys)+len(fields)), nested: c.nested, component: c.component}
	for k := range c.keys {
		n.keys[k] = true
	}
	fields = n.filter(fields)
	n.Core = c.Core.With(fields)
	return n
}

// filter drops fields whose key is already set and records the others in
// c.keys. It must only be called on a core nobody else sees yet, or on a
// throwaway copy.
func (c *cliCore) filter(fields []zapcore.Field) []zapcore.Field {
	out := fields[:0:0]
	for _, f := range fields {
		if c.nested {
			out = append(out, f)
			continue
		}
		if f.Type == zapcore.NamespaceType {
			c.nested = true
			out = append(out, f)
			continue
		}
		if c.keys[f.Key] {
			continue
		}
		c.keys[f.Key] = true
		if f.Key == "component" && f.Type == zapcore.StringType {
			c.component = f.String
		}
		out = append(out, f)
	}
	return out
}

func (c *cliCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *cliCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	scratch := &cliCore{keys: make(map[string]bool, len(c.keys)+len(fields)), nested: c.nested, component: c.component}
	for k := range c.keys {
		scratch.keys[k] = true
	}
	fields = scratch.filter(fields)
	if e.Level == zapcore.InfoLevel && chatter(scratch.component) {
		if !c.Enabled(zapcore.DebugLevel) {
			return nil
		}
		e.Level = zapcore.DebugLevel
	}
	return c.Core.Write(e, fields)
}
