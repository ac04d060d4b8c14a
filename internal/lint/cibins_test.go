package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// processTestBinaries returns the names of the binaries that the tests
// below root run through proctest.Main (its third argument), each built by
// the package's TestMain unless its WEIR_TEST_BIN_<NAME> names one.
func processTestBinaries(t *testing.T, root string) []string {
	t.Helper()
	var names []string
	fset := token.NewFileSet()
	err := walkGoFiles(root, true, func(path string) error {
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 3 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Main" {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "proctest" {
				return true
			}
			lit, ok := call.Args[2].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Errorf("%s: proctest.Main's binary name is not a string literal", fset.Position(call.Pos()))
				return true
			}
			name, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Errorf("%s: %v", fset.Position(lit.Pos()), err)
			} else if !slices.Contains(names, name) {
				names = append(names, name)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

// unprebuilt returns the names whose WEIR_TEST_BIN_<NAME> the CI script
// does not export: binaries that the race step's TestMains would build
// again, inside the race step, with its environment's cgo setting.
func unprebuilt(names []string, script string) []string {
	var missing []string
	for _, name := range names {
		v := "WEIR_TEST_BIN_" + strings.ToUpper(name)
		if !regexp.MustCompile(`(?m)^export\b.*\b` + v + `=`).MatchString(script) {
			missing = append(missing, name)
		}
	}
	return missing
}

// Every binary a process test runs is built once by .ci/run before the race
// step and named to the tests: a TestMain that builds its own inside the
// race step compiles what the binary holds once more (with cgo on, a cache
// key no other step uses), as examples/uppercase/cmd/uppercase's did.
func TestCIBuildsEveryProcessTestBinaryBeforeTheRaceStep(t *testing.T) {
	root := moduleRoot(t)
	names := processTestBinaries(t, root)
	for _, want := range []string{"streamctl", "uppercase"} {
		if !slices.Contains(names, want) {
			t.Fatalf("process test binaries %v: %q not found (the search is broken)", names, want)
		}
	}
	script, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	if missing := unprebuilt(names, string(script)); len(missing) > 0 {
		t.Errorf(".ci/run exports no WEIR_TEST_BIN_ for %v: build them with streamctl before the race step", missing)
	}
}

func TestUnprebuiltFindsABinaryTheScriptDoesNotName(t *testing.T) {
	for _, tc := range []struct {
		script string
		want   []string
	}{
		{"export WEIR_TEST_BIN_STREAMCTL=\"$logs/bin/streamctl\" WEIR_TEST_BIN_UPPERCASE=\"$logs/bin/uppercase\"\n", nil},
		{"export WEIR_TEST_BIN_STREAMCTL=\"$logs/bin/streamctl\"\n", []string{"uppercase"}},
		{"# WEIR_TEST_BIN_UPPERCASE= in a comment\nexport WEIR_TEST_BIN_STREAMCTL=x\n", []string{"uppercase"}},
		{"", []string{"streamctl", "uppercase"}},
	} {
		if got := unprebuilt([]string{"streamctl", "uppercase"}, tc.script); !slices.Equal(got, tc.want) {
			t.Errorf("unprebuilt(%q) = %v, want %v", tc.script, got, tc.want)
		}
	}
}
