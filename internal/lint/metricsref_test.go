package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// operatorMetricMethods are the methods of runtime.Metrics; the task
// manager exposes what they register with the prefix "weir_".
var operatorMetricMethods = map[string]bool{"Counter": true, "Gauge": true, "Gauges": true}

// registeredMetrics returns the name of every metric the module's non-test
// code registers: the first argument of prometheus.NewDesc, the Name of a
// prometheus.*Opts literal, and, prefixed with "weir_", the first argument
// of a runtime.Metrics call (Counter, Gauge, Gauges). Each must be a string
// literal, or the call is reported: a metric this test cannot see would go
// undocumented.
func registeredMetrics(t *testing.T, root string) map[string]string {
	t.Helper()
	found := map[string]string{} // name -> where
	err := walkGoFiles(root, false, func(path string) error {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		literal := func(e ast.Expr) (string, bool) {
			lit, ok := e.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return "", false
			}
			s, err := strconv.Unquote(lit.Value)
			return s, err == nil
		}
		add := func(n ast.Node, name string) {
			rel, _ := filepath.Rel(root, fset.Position(n.Pos()).Filename)
			found[name] = rel
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok || len(n.Args) == 0 {
					return true
				}
				pkg, _ := sel.X.(*ast.Ident)
				switch {
				case pkg != nil && pkg.Name == "prometheus" && sel.Sel.Name == "NewDesc":
					if name, ok := literal(n.Args[0]); ok {
						add(n, name)
					} else if !isPrefixedOperatorMetric(n.Args[0]) {
						t.Errorf("%s: prometheus.NewDesc with a name that is not a string literal", fset.Position(n.Pos()))
					}
				case operatorMetricMethods[sel.Sel.Name] && len(n.Args) >= 3:
					if name, ok := literal(n.Args[0]); ok {
						add(n, "weir_"+name)
					}
				}
			case *ast.CompositeLit:
				sel, ok := n.Type.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if pkg, _ := sel.X.(*ast.Ident); pkg == nil || pkg.Name != "prometheus" {
					return true
				}
				for _, el := range n.Elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok {
						if k, _ := kv.Key.(*ast.Ident); k != nil && k.Name == "Name" {
							if name, ok := literal(kv.Value); ok {
								add(n, name)
							}
						}
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// isPrefixedOperatorMetric reports whether e is "weir_" + something: the
// task manager exposing the operator metrics registered through
// runtime.Metrics, whose names registeredMetrics collects at their calls.
func isPrefixedOperatorMetric(e ast.Expr) bool {
	b, ok := e.(*ast.BinaryExpr)
	if !ok || b.Op != token.ADD {
		return false
	}
	lit, ok := b.X.(*ast.BasicLit)
	return ok && lit.Value == `"weir_"`
}

// documentedMetric is a metric name in the metrics reference; one ending
// in "_" is a prefix ("weir_job_"), not a name.
var documentedMetric = regexp.MustCompile(`\bweir_[A-Za-z0-9_]*`)

// docs/reference/metrics.md lists every metric the module registers (the
// job manager's, the task managers', the share-group source's and the
// transactional operators'), and names none that is not registered.
func TestMetricsReferenceListsEveryMetric(t *testing.T) {
	root := moduleRoot(t)
	const page = "docs/reference/metrics.md"
	registered := registeredMetrics(t, root)
	if len(registered) < 15 {
		t.Fatalf("found only %d registered metrics: is the parsing broken? %v", len(registered), registered)
	}
	md, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, name := range documentedMetric.FindAllString(string(md), -1) {
		if !strings.HasSuffix(name, "_") {
			documented[name] = true
		}
	}
	var names []string
	for name := range registered {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !documented[name] {
			t.Errorf("%s registers %s, which %s does not list", registered[name], name, page)
		}
		delete(documented, name)
	}
	for name := range documented {
		t.Errorf("%s names %s, which no code registers", page, name)
	}
}
