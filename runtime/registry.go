package runtime

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ErrUnknownJob is returned for a job type name nobody registered.
var ErrUnknownJob = errors.New("unknown job type")

// ErrBadParam is wrapped by errors about job parameters.
var ErrBadParam = errors.New("bad job parameter")

// ParamSpec documents one parameter of a job type.
type ParamSpec struct {
	Name        string
	Default     string
	Description string
}

// JobType is a job registered by name: every node of a cluster runs the same
// binary and builds the same graph from the name and the parameters.
type JobType struct {
	Name        string
	Description string
	Params      []ParamSpec
	// Build builds the job graph. p holds every declared parameter, with
	// defaults filled in.
	Build func(p Params) (*Job, error)
	// Check, if set, checks what Build cannot before a job manager accepts
	// the job: that the systems the job reads and writes are reachable and
	// able to run it (e.g. the brokers support share groups). Its error is
	// the submission's answer. p is as for Build.
	Check func(ctx context.Context, p Params) error
}

// Params are a job's parameters (string values, as given with --set).
type Params map[string]string

// ParamParallelism is the reserved parameter carrying the job's default
// parallelism (streamctl submit --parallelism); a JobType need not declare
// it and passes p.JobOpts() to NewJob.
const ParamParallelism = "parallelism"

// ParamStateBackend is the reserved parameter carrying the job's state
// backend, "heap" or "pebble" (streamctl run|submit --state-backend); like
// ParamParallelism a JobType need not declare it: p.JobOpts() applies it.
const ParamStateBackend = "state-backend"

// reservedParam says whether every job type takes the parameter.
func reservedParam(name string) bool { return name == ParamParallelism || name == ParamStateBackend }

// JobOpts returns the job options the reserved parameters ask for.
func (p Params) JobOpts() ([]JobOpt, error) {
	var opts []JobOpt
	if v, ok := p[ParamParallelism]; ok && v != "" {
		n, err := p.Int(ParamParallelism)
		if err != nil {
			return nil, err
		}
		if n < 1 {
			return nil, fmt.Errorf("%w: %s=%d must be at least 1", ErrBadParam, ParamParallelism, n)
		}
		opts = append(opts, DefaultParallelism(n))
	}
	if v, ok := p[ParamStateBackend]; ok && v != "" {
		k, err := ParseStateBackend(v)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrBadParam, ParamStateBackend, err)
		}
		opts = append(opts, StateBackend(k))
	}
	return opts, nil
}

// String returns the parameter's value.
func (p Params) String(name string) string { return p[name] }

// Int parses the parameter as an integer.
func (p Params) Int(name string) (int, error) {
	v, err := strconv.Atoi(p[name])
	if err != nil {
		return 0, fmt.Errorf("%w: %s=%q is not an integer", ErrBadParam, name, p[name])
	}
	return v, nil
}

// Duration parses the parameter as a Go duration (e.g. 500ms).
func (p Params) Duration(name string) (time.Duration, error) {
	v, err := time.ParseDuration(p[name])
	if err != nil {
		return 0, fmt.Errorf("%w: %s=%q is not a duration", ErrBadParam, name, p[name])
	}
	return v, nil
}

// Durations parses each named parameter as a Go duration that is not
// negative, in the order of names (the bounds and timeouts of the bundled
// jobs' event-time parameters).
func (p Params) Durations(names ...string) ([]time.Duration, error) {
	out := make([]time.Duration, len(names))
	for i, name := range names {
		v, err := p.Duration(name)
		if err != nil {
			return nil, err
		}
		if v < 0 {
			return nil, fmt.Errorf("%w: %s=%v < 0", ErrBadParam, name, v)
		}
		out[i] = v
	}
	return out, nil
}

// OneOf checks the parameter is one of allowed and returns it.
func (p Params) OneOf(name string, allowed ...string) (string, error) {
	v := p[name]
	for _, a := range allowed {
		if v == a {
			return v, nil
		}
	}
	return "", fmt.Errorf("%w: %s=%q, want one of %s", ErrBadParam, name, v, strings.Join(allowed, ", "))
}

// Registry maps job type names to job types. Build one at program start and
// register every job type the binary can run.
type Registry struct {
	types map[string]JobType
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{types: map[string]JobType{}} }

// Register adds a job type; names are unique.
func (r *Registry) Register(t JobType) error {
	if t.Name == "" || t.Build == nil {
		return fmt.Errorf("job type needs a name and a Build function")
	}
	if _, dup := r.types[t.Name]; dup {
		return fmt.Errorf("job type %q registered twice", t.Name)
	}
	r.types[t.Name] = t
	return nil
}

// Types lists the registered job types by name.
func (r *Registry) Types() []JobType {
	out := make([]JobType, 0, len(r.types))
	for _, t := range r.types {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Build builds the job graph of a registered type. Unknown parameters are an
// error (a typo must not silently run with a default); missing ones take
// their defaults.
func (r *Registry) Build(name string, params map[string]string) (*Job, error) {
	t, p, err := r.params(name, params)
	if err != nil {
		return nil, err
	}
	return t.Build(p)
}

// Check runs the job type's Check with the parameters as Build sees them.
func (r *Registry) Check(ctx context.Context, name string, params map[string]string) error {
	t, p, err := r.params(name, params)
	if err != nil {
		return err
	}
	if t.Check == nil {
		return nil
	}
	return t.Check(ctx, p)
}

// params looks up a job type and fills in its parameters' defaults,
// refusing unknown ones.
func (r *Registry) params(name string, params map[string]string) (JobType, Params, error) {
	t, ok := r.types[name]
	if !ok {
		names := make([]string, 0, len(r.types))
		for n := range r.types {
			names = append(names, n)
		}
		sort.Strings(names)
		return JobType{}, nil, fmt.Errorf("%w %q (registered: %s)", ErrUnknownJob, name, strings.Join(names, ", "))
	}
	p := Params{}
	known := map[string]bool{}
	for _, s := range t.Params {
		known[s.Name] = true
		p[s.Name] = s.Default
	}
	for k, v := range params {
		if !known[k] && !reservedParam(k) {
			return JobType{}, nil, fmt.Errorf("%w: job %q has no parameter %q", ErrBadParam, name, k)
		}
		p[k] = v
	}
	return t, p, nil
}
