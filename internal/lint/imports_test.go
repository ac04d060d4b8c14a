package lint

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/weirstream/weir/"

// rule forbids packages under from (a module-relative path prefix) to import
// packages under any of to.
type rule struct {
	from string
	to   []string
	why  string
}

var rules = []rule{
	{"runtime", []string{"jobmanager", "taskmanager", "sources", "sinks", "internal/kafkatxn", "internal/deadletter", "internal/broker"},
		"runtime is the core: it knows no connector and no cluster"},
	{"checkpoint", []string{"runtime", "jobmanager", "taskmanager", "sources", "sinks"},
		"checkpoint deals in ids, handles and bytes, not operators"},
	{"sources", []string{"sinks", "jobmanager", "taskmanager"},
		"a source is written like user code and never imports a sink: shared Kafka code is internal/kafkatxn"},
	{"sinks", []string{"sources", "jobmanager", "taskmanager"},
		"a sink is written like user code and never imports a source: shared Kafka code is internal/kafkatxn"},
	{"sources/kafka", []string{"sources/sharegroup"},
		"the partition source never imports the share-group source: what both need is internal/kafkatxn and internal/deadletter"},
	{"sources/sharegroup", []string{"sources/kafka"},
		"the share-group source never imports the partition source: what both need is internal/kafkatxn and internal/deadletter"},
	{"internal/deadletter", []string{"runtime", "sources", "sinks", "jobmanager", "taskmanager"},
		"the shared dead-letter code knows no operator and no cluster"},
	{"internal", []string{"runtime", "sources", "sinks", "jobmanager", "taskmanager", "cli", "cmd", "examples", "weirtest", "bench", "test"},
		"internal/ holds only infrastructure the product packages share; the tools that drive the product (benchmarks, the demo, cluster tests) live in bench/ and test/"},
	{"jobmanager", []string{"taskmanager"}, "the job manager and task managers share only the RPC contract"},
	{"taskmanager", []string{"jobmanager"}, "the job manager and task managers share only the RPC contract"},
	{"examples", []string{"internal", "jobmanager", "taskmanager"}, "examples use only what a user may use"},
	{"internal/kafkatxn", []string{"runtime", "sources", "sinks", "jobmanager", "taskmanager"},
		"the shared Kafka transaction code knows no operator and no cluster"},
	{"internal/rpc", []string{"runtime", "jobmanager", "taskmanager", "sources", "sinks"},
		"the RPC contract carries ids and bytes; it is what the job manager and task managers share"},
	{"weirtest", []string{"jobmanager", "taskmanager", "cli", "cmd", "examples", "test", "bench"},
		"weirtest is a user's test kit: it drives runtime, checkpoint, the connectors and the embedded broker, never a cluster process or the product's commands"},
}

// private lists packages (module-relative prefixes) that only the packages
// under importers (and the package itself) may import.
var private = []struct {
	pkg       string
	importers []string
	why       string
}{
	{"cli", []string{"cmd", "examples"},
		"cli is the command line as a library for a program's main (cmd/streamctl, a user's own main as in examples/...); no other package may depend on it"},
	{"bench", []string{"cli"},
		"the benchmarks are a tool that drives the product: `streamctl bench` (cli) runs them, no product package depends on them"},
	{"test", []string{"cli"},
		"test/ holds the tools that test the product; only `streamctl demo` (cli) runs one of them (test/demo)"},
	{"weirtest", nil,
		"weirtest is the test kit for users' tests: no package of the product imports it (tests may, examples' tests among them)"},
}

// importAllowed reports whether the package pkg may import imp under the
// private rules, and why not.
func importAllowed(pkg, imp string) (bool, string) {
	for _, p := range private {
		if !under(imp, p.pkg) || under(pkg, p.pkg) {
			continue
		}
		ok := false
		for _, i := range p.importers {
			ok = ok || under(pkg, i)
		}
		if !ok {
			return false, p.why
		}
	}
	return true, ""
}

// under reports whether the module-relative package path p is dir or below it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

func TestImportRules(t *testing.T) {
	root := moduleRoot(t)
	files := 0
	err := walkGoFiles(root, false, func(path string) error {
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := filepath.ToSlash(rel)
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		files++
		for _, is := range f.Imports {
			imp, _ := strconv.Unquote(is.Path.Value)
			if !strings.HasPrefix(imp, module) {
				continue
			}
			imp = strings.TrimPrefix(imp, module)
			if ok, why := importAllowed(pkg, imp); !ok {
				t.Errorf("%s imports %s: %s", filepath.ToSlash(mustRel(root, path)), imp, why)
			}
			for _, r := range rules {
				if !under(pkg, r.from) {
					continue
				}
				for _, to := range r.to {
					if under(imp, to) {
						t.Errorf("%s imports %s: %s", filepath.ToSlash(mustRel(root, path)), imp, r.why)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("checked only %d files under %s: the walk is broken", files, root)
	}
}

func mustRel(root, path string) string {
	r, err := filepath.Rel(root, path)
	if err != nil {
		return path
	}
	return r
}

// TestImportRulesPrefixMatch checks the checker: a rule's prefix match
// must not be fooled by a sibling with a common prefix.
func TestImportRulesPrefixMatch(t *testing.T) {
	for _, c := range []struct {
		p, dir string
		want   bool
	}{
		{"sources/sharegroup", "sources", true},
		{"sources", "sources", true},
		{"sourcesx", "sources", false},
		{"internal/kafkatxn/committed", "internal/kafkatxn", true},
		{"internal/kafkatest", "internal/kafkatxn", false},
	} {
		if got := under(c.p, c.dir); got != c.want {
			t.Errorf("under(%q, %q) = %v, want %v", c.p, c.dir, got, c.want)
		}
	}
}

// TestPrivateImports checks the private rules' matcher.
func TestPrivateImports(t *testing.T) {
	for _, c := range []struct {
		pkg, imp string
		want     bool
	}{
		{"cmd/streamctl", "cli", true},
		{"examples/customjob", "cli", true},
		{"cli", "cli", true},
		{"runtime", "cli", false},
		{"test/demo", "cli", false},
		{"cli", "test/demo", true},
		{"cli", "bench", true},
		{"runtime", "bench", false},
		{"jobmanager", "test/cluster", false},
		{"clix", "cli", false},
		{"runtime", "clix", true},
		{"runtime", "weirtest", false},
		{"examples/wordcount", "weirtest", false},
		{"internal/kafkatest", "weirtest", false},
		{"weirtest", "weirtest", true},
		{"weirtest", "runtime", true},
	} {
		if got, _ := importAllowed(c.pkg, c.imp); got != c.want {
			t.Errorf("importAllowed(%q, %q) = %v, want %v", c.pkg, c.imp, got, c.want)
		}
	}
}
