package jobmanager

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strings"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/runtime"
)

// ErrSavepointLocation is returned when a client names a savepoint location
// (FromSavepoint, a savepoint target) outside every allowed location. The
// error says nothing of the location but that: not whether it exists, nor
// anything it holds.
var ErrSavepointLocation = errors.New("not an allowed savepoint location")

// SavepointAllowedLocations adds directories and savepoint URLs under which
// clients may name savepoint locations: the savepoint a job is submitted
// from (FromSavepoint) and the target of a savepoint or stop-with-savepoint
// (StartSavepoint). SavepointDir and DataDir are always allowed; nothing
// else is by default. A directory location must lie below an allowed
// directory without a ".." in it, and the job manager follows no symbolic
// link below the allowed directory (checkpoint.Beneath). A savepoint URL
// must name the scheme and bucket of an allowed URL and a path below its
// prefix; its connection parameters (endpoint, region, path-style) are the
// allowed URL's, which a client may repeat or leave out but never change:
// the job manager never sends its storage credentials to an endpoint a
// client chose. Locations the operator configures (SavepointDir, the
// retained checkpoints of RetainOnCancel) are not checked.
func SavepointAllowedLocations(locs ...string) Opt {
	return optFunc(func(c *cfg) { c.savepointAllowed = append(c.savepointAllowed, locs...) })
}

// savepointRoot is one allowed savepoint location: a directory (absolute,
// clean) or a URL of object storage.
type savepointRoot struct {
	dir string
	u   *url.URL
}

// savepointRoots parses the allowed savepoint locations of c.
func savepointRoots(c cfg) ([]savepointRoot, error) {
	var roots []savepointRoot
	for _, loc := range append([]string{c.savepointDir, c.dir}, c.savepointAllowed...) {
		if loc == "" {
			continue
		}
		bad := func(why string) error {
			return fmt.Errorf("%w: allowed savepoint location %q: %s", runtime.ErrInvalidOption, loc, why)
		}
		if !checkpoint.IsSavepointURL(loc) {
			abs, err := filepath.Abs(loc)
			if err != nil {
				return nil, bad(err.Error())
			}
			roots = append(roots, savepointRoot{dir: abs})
			continue
		}
		u, err := url.Parse(loc)
		if err != nil {
			return nil, bad(err.Error())
		}
		switch {
		case u.User != nil || u.Fragment != "" || u.Opaque != "":
			return nil, bad("a savepoint URL has no user, fragment or opaque part")
		case u.Scheme == "file":
			if (u.Host != "" && u.Host != "localhost") || !strings.HasPrefix(u.Path, "/") {
				return nil, bad("a file URL names an absolute local directory (file:///abs/dir)")
			}
			roots = append(roots, savepointRoot{dir: filepath.Clean(filepath.FromSlash(u.Path))})
		default:
			r := *u
			r.Path, r.RawPath = "/"+strings.Trim(u.Path, "/"), ""
			roots = append(roots, savepointRoot{u: &r})
		}
	}
	return roots, nil
}

// savepointLocation checks a savepoint location a client named against the
// allowed ones and returns the location to open (a directory: absolute; a
// URL: with the allowed URL's connection parameters) and the options to
// open it with (a directory: confined Beneath its allowed root).
func (s *Server) savepointLocation(loc string) (string, []checkpoint.SavepointOpt, error) {
	refuse := func(hint string) (string, []checkpoint.SavepointOpt, error) {
		return "", nil, fmt.Errorf("savepoint location %q: %w (allowed: the job manager's --savepoint-dir, --data-dir and --savepoint-allowed-locations%s)", loc, ErrSavepointLocation, hint)
	}
	dotDot := func(p string) bool {
		return slices.Contains(strings.FieldsFunc(p, func(r rune) bool { return r == '/' || r == '\\' }), "..")
	}
	if dotDot(loc) {
		return refuse("; no \"..\"")
	}
	dir := loc
	if checkpoint.IsSavepointURL(loc) {
		u, err := url.Parse(loc)
		if err != nil || u.User != nil || u.Fragment != "" || u.Opaque != "" {
			return refuse("")
		}
		if dotDot(u.Path) { // escaped: %2e%2e
			return refuse("; no \"..\"")
		}
		if u.Scheme != "file" {
			return s.savepointURL(u, refuse)
		}
		if (u.Host != "" && u.Host != "localhost") || u.RawQuery != "" || !strings.HasPrefix(u.Path, "/") {
			return refuse("")
		}
		dir = filepath.FromSlash(u.Path)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return refuse("")
	}
	// The most specific allowed directory: one the operator allowed below
	// another (the data directory) may itself be a link.
	root := ""
	for _, r := range s.savepointRoots {
		if r.dir == "" || len(r.dir) <= len(root) {
			continue
		}
		if rel, err := filepath.Rel(r.dir, abs); err == nil && (rel == "." || filepath.IsLocal(rel)) {
			root = r.dir
		}
	}
	if root == "" {
		return refuse("")
	}
	return abs, []checkpoint.SavepointOpt{checkpoint.Beneath(root)}, nil
}

// savepointURL is savepointLocation for a URL of object storage.
func (s *Server) savepointURL(u *url.URL, refuse func(string) (string, []checkpoint.SavepointOpt, error)) (string, []checkpoint.SavepointOpt, error) {
	p := strings.Trim(u.Path, "/")
	query, err := url.ParseQuery(u.RawQuery)
	if err != nil || u.RawPath != "" && u.RawPath != u.Path {
		return refuse("")
	}
	sameBucket := false
	for _, r := range s.savepointRoots {
		if r.u == nil || r.u.Scheme != u.Scheme || r.u.Host != u.Host {
			continue
		}
		rp := strings.Trim(r.u.Path, "/")
		if rp != "" && p != rp && !strings.HasPrefix(p, rp+"/") {
			continue
		}
		sameBucket = true
		allowed := r.u.Query()
		if !allParams(query, allowed) {
			continue
		}
		out := *r.u
		out.Path, out.RawPath = "/"+p, ""
		return out.String(), nil, nil
	}
	if sameBucket {
		return refuse("; a savepoint URL may leave out its endpoint, region and path-style, or repeat the allowed location's, never change them")
	}
	return refuse("")
}

// allParams reports whether every parameter of q has the value it has in
// allowed.
func allParams(q, allowed url.Values) bool {
	for k, vs := range q {
		if !slices.Equal(vs, allowed[k]) {
			return false
		}
	}
	return true
}
