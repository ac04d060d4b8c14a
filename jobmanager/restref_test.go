package jobmanager

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// servedRoutes returns the method-and-path patterns rest.go registers on
// its muxes (Handle and HandleFunc with a literal pattern), as a user writes
// them: "GET /{$}" is "GET /", a subtree "GET /static/" is "GET /static/...".
// The catch-all "/" that mounts the token-checked API is not a route.
func servedRoutes(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "rest.go", nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var routes []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || (sel.Sel.Name != "Handle" && sel.Sel.Name != "HandleFunc") || len(call.Args) != 2 {
			return true
		}
		lit, ok := call.Args[0].(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			t.Errorf("%s: a route pattern that is not a string literal: this test cannot read it", fset.Position(call.Pos()))
			return true
		}
		pattern, err := strconv.Unquote(lit.Value)
		if err != nil {
			t.Fatal(err)
		}
		if pattern == "/" {
			return true
		}
		pattern = strings.TrimSuffix(pattern, "{$}")
		if strings.HasSuffix(pattern, "/") && !strings.HasSuffix(pattern, " /") {
			pattern += "..."
		}
		routes = append(routes, pattern)
		return true
	})
	sort.Strings(routes)
	return slices.Compact(routes)
}

// documentedRoute is a route named in the REST reference: a method and a
// path in backquotes; a query string is not part of the route.
var documentedRoute = regexp.MustCompile("`((?:GET|POST|PUT|PATCH|DELETE|HEAD) /[^`?\\s]*)[^`]*`")

// docs/reference/rest.md lists every route the job manager serves, and no
// route it does not serve.
func TestRESTReferenceListsEveryRoute(t *testing.T) {
	const page = "../docs/reference/rest.md"
	served := servedRoutes(t)
	if len(served) < 5 {
		t.Fatalf("found only %d routes in rest.go (%v): is the parsing broken?", len(served), served)
	}
	md, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range documentedRoute.FindAllStringSubmatch(string(md), -1) {
		documented[m[1]] = true
	}
	for _, r := range served {
		if !documented[r] {
			t.Errorf("the job manager serves `%s`, which %s does not list", r, page)
		}
		delete(documented, r)
	}
	for r := range documented {
		t.Errorf("%s lists `%s`, which the job manager does not serve", page, r)
	}
}
