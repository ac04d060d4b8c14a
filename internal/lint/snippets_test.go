package lint

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// markdownFiles returns the documentation, module-relative: README.md and
// every .md file below docs/. Their Go snippets must be quotes of compiled
// example tests, the tests they name must exist and their relative links
// must resolve.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	out := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".md") {
			return err
		}
		rel, err := filepath.Rel(root, path)
		out = append(out, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 5 {
		t.Fatalf("found only %v: is docs/ there?", out)
	}
	return out
}

// exampleMarker is the comment that must come right before every ```go
// block: the module-relative path of a _test.go file and the name of an
// Example function in it, which the block quotes.
var exampleMarker = regexp.MustCompile(`^<!-- example: (\S+_test\.go) (Example\w*) -->$`)

// snippet is one ```go block of a Markdown file.
type snippet struct {
	line       int    // of the ```go fence, 1-based
	file, fn   string // from the marker; empty when there is none
	lines      []string
	markerLine string // the line before the fence
}

// goSnippets returns the ```go blocks of the Markdown text md.
func goSnippets(md string) ([]snippet, error) {
	var out []snippet
	var cur *snippet
	prev := ""
	sc := bufio.NewScanner(strings.NewReader(md))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur != nil && trimmed == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, line)
		case strings.HasPrefix(trimmed, "```go"):
			cur = &snippet{line: n, markerLine: prev}
			if m := exampleMarker.FindStringSubmatch(prev); m != nil {
				cur.file, cur.fn = m[1], m[2]
			}
		}
		if trimmed != "" {
			prev = trimmed
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("line %d: ```go block never closed", cur.line)
	}
	return out, sc.Err()
}

// normalize drops indentation and blank lines: a quote may be indented
// differently from the function it comes from.
func normalize(lines []string) []string {
	var out []string
	for _, l := range lines {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// contains reports whether sub occurs in lines as a contiguous run.
func contains(lines, sub []string) bool {
	if len(sub) == 0 {
		return false
	}
outer:
	for i := 0; i+len(sub) <= len(lines); i++ {
		for k := range sub {
			if lines[i+k] != sub[k] {
				continue outer
			}
		}
		return true
	}
	return false
}

// checkSnippet checks that s quotes the body of its marked Example function,
// verbatim up to indentation. root is the module root.
func checkSnippet(root string, s snippet) error {
	if s.file == "" {
		return fmt.Errorf("line %d: a ```go block must follow a marker <!-- example: PATH_test.go ExampleName --> naming the example test it quotes (found %q)", s.line, s.markerLine)
	}
	path := filepath.Join(root, filepath.FromSlash(s.file))
	src, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("line %d: %w", s.line, err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, 0)
	if err != nil {
		return fmt.Errorf("line %d: %w", s.line, err)
	}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Recv != nil || fd.Name.Name != s.fn {
			continue
		}
		if fd.Type.Params.NumFields() != 0 || fd.Type.Results.NumFields() != 0 || fd.Body == nil {
			return fmt.Errorf("line %d: %s in %s is not an example test (it takes or returns something)", s.line, s.fn, s.file)
		}
		body := string(src[fset.Position(fd.Body.Lbrace).Offset:fset.Position(fd.Body.Rbrace).Offset])
		if !contains(normalize(strings.Split(body, "\n")), normalize(s.lines)) {
			return fmt.Errorf("line %d: the ```go block is not a verbatim quote (up to indentation) of %s in %s; copy it from there", s.line, s.fn, s.file)
		}
		return nil
	}
	return fmt.Errorf("line %d: no func %s in %s", s.line, s.fn, s.file)
}

// Every Go snippet of the documentation is a quote of an example test, which
// `go test` compiles (and runs, when it has an Output comment): a snippet
// that does not compile cannot stay in the README.
func TestDocumentedGoSnippetsQuoteExampleTests(t *testing.T) {
	root := moduleRoot(t)
	total := 0
	documented := markdownFiles(t, root)
	for _, doc := range documented {
		md, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		snippets, err := goSnippets(string(md))
		if err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
		for _, s := range snippets {
			total++
			if err := checkSnippet(root, s); err != nil {
				t.Errorf("%s:%v", doc, err)
			}
		}
	}
	if total < 4 {
		t.Fatalf("found only %d Go snippets in %v: the README has at least 4; is the fence parsing broken?", total, documented)
	}
}

// The checker itself, on fixtures: each way a snippet can be wrong is caught.
func TestSnippetCheckerCatchesEveryMismatch(t *testing.T) {
	root := "testdata"
	tests := []struct {
		name, md string
		want     string // substring of the error; "" for none
	}{
		{"verbatim quote, other indentation", "<!-- example: snippets/example_test.go ExampleGreet -->\n```go\ngreeting := \"hello\"\n\nfmt.Println(greeting)\n```\n", ""},
		{"whole function body", "<!-- example: snippets/example_test.go ExampleGreet -->\n```go\n// A greeting.\ngreeting := \"hello\"\nfmt.Println(greeting)\n// Output: hello\n```\n", ""},
		{"no marker", "Some text.\n```go\nfmt.Println(greeting)\n```\n", "must follow a marker"},
		{"marker not right before", "<!-- example: snippets/example_test.go ExampleGreet -->\nText between.\n```go\nfmt.Println(greeting)\n```\n", "must follow a marker"},
		{"changed line", "<!-- example: snippets/example_test.go ExampleGreet -->\n```go\ngreeting := \"hi\"\n```\n", "not a verbatim quote"},
		{"lines out of order", "<!-- example: snippets/example_test.go ExampleGreet -->\n```go\nfmt.Println(greeting)\ngreeting := \"hello\"\n```\n", "not a verbatim quote"},
		{"from another function", "<!-- example: snippets/example_test.go ExampleGreet -->\n```go\nfmt.Println(\"bye\")\n```\n", "not a verbatim quote"},
		{"empty block", "<!-- example: snippets/example_test.go ExampleGreet -->\n```go\n```\n", "not a verbatim quote"},
		{"unknown function", "<!-- example: snippets/example_test.go ExampleMissing -->\n```go\nfmt.Println(greeting)\n```\n", "no func ExampleMissing"},
		{"not an example signature", "<!-- example: snippets/example_test.go ExampleWithArg -->\n```go\nfmt.Println(s)\n```\n", "not an example test"},
		{"missing file", "<!-- example: snippets/gone_test.go ExampleGreet -->\n```go\nfmt.Println(greeting)\n```\n", "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			snippets, err := goSnippets(tt.md)
			if err != nil || len(snippets) != 1 {
				t.Fatalf("goSnippets = %d snippets, %v; want 1", len(snippets), err)
			}
			err = checkSnippet(root, snippets[0])
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error = %v, want one containing %q", err, tt.want)
			}
		})
	}
	if _, err := goSnippets("```go\nx := 1\n"); err == nil {
		t.Fatal("an unclosed ```go block was accepted")
	}
}
