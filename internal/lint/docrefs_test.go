package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// testRef is a test or example function named in backquotes in the
// documentation, optionally with a subtest ("TestX/case").
var testRef = regexp.MustCompile("`((?:Test|Example)\\w*)(?:/[^`]*)?`")

// The failure matrix of docs/architecture.md, and the README, name the tests
// that cover each case: every name must be a test (or example) function of
// the module, so a renamed or deleted test cannot leave the documentation
// pointing at nothing.
func TestDocumentedTestsExist(t *testing.T) {
	root := moduleRoot(t)
	have := map[string]bool{}
	err := walkGoFiles(root, true, func(path string) error {
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
				have[fd.Name.Name] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	refs := 0
	documented := markdownFiles(t, root)
	for _, doc := range documented {
		md, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range testRef.FindAllStringSubmatch(string(md), -1) {
			refs++
			if !have[m[1]] {
				t.Errorf("%s names %s, which is no test or example function of the module", doc, m[1])
			}
		}
	}
	if refs < 20 {
		t.Fatalf("found only %d test names in %v: the failure matrix names more", refs, documented)
	}
}
