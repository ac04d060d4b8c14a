package lint

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// mdLink is a Markdown link or image: [text](target) or ![alt](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// inlineCode is a code span, whose text is not a link.
var inlineCode = regexp.MustCompile("`[^`]*`")

// headingAnchor returns the anchor GitHub gives a heading: lower case,
// punctuation other than '-' and '_' dropped, spaces turned into '-'.
func headingAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// mdDoc is what the link check needs of a Markdown file: its links (with
// their lines) and its headings' anchors.
type mdDoc struct {
	links   []mdLinkAt
	anchors map[string]bool
}

type mdLinkAt struct {
	line   int
	target string
}

// parseMarkdown reads the links and heading anchors of md, outside fenced
// code blocks and code spans. Repeated headings get GitHub's -1, -2
// suffixes.
func parseMarkdown(md string) mdDoc {
	d := mdDoc{anchors: map[string]bool{}}
	seen := map[string]int{}
	fenced := false
	sc := bufio.NewScanner(strings.NewReader(md))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		if h := strings.TrimLeft(line, "#"); h != line && strings.HasPrefix(h, " ") {
			a := headingAnchor(strings.TrimSpace(strings.ReplaceAll(h, "`", "")))
			if k := seen[a]; k > 0 {
				d.anchors[fmt.Sprintf("%s-%d", a, k)] = true
			} else {
				d.anchors[a] = true
			}
			seen[a]++
		}
		for _, m := range mdLink.FindAllStringSubmatch(inlineCode.ReplaceAllString(line, ""), -1) {
			d.links = append(d.links, mdLinkAt{n, m[1]})
		}
	}
	return d
}

// checkLinks returns an error for every relative link of the Markdown file
// doc (module-relative) that names no file or directory of the module, or a
// heading anchor that the target file does not have. read returns a
// Markdown file's text.
func checkLinks(root, doc string, read func(string) (string, error)) []error {
	text, err := read(doc)
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, l := range parseMarkdown(text).links {
		if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
			continue
		}
		file, anchor, _ := strings.Cut(l.target, "#")
		target := doc
		if file != "" {
			target = path.Join(path.Dir(doc), file)
			if strings.HasPrefix(target, "../") {
				errs = append(errs, fmt.Errorf("%s:%d: link %s leaves the repository", doc, l.line, l.target))
				continue
			}
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(target))); err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: link %s: no such file %s", doc, l.line, l.target, target))
				continue
			}
		}
		if anchor == "" || !strings.HasSuffix(target, ".md") {
			continue
		}
		md, err := read(target)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !parseMarkdown(md).anchors[anchor] {
			errs = append(errs, fmt.Errorf("%s:%d: link %s: %s has no heading #%s", doc, l.line, l.target, target, anchor))
		}
	}
	return errs
}

// Every relative link of README.md and docs/**/*.md names a file of the
// module and, with #anchor, a heading of that file: moving or renaming a
// page or a section cannot leave a link pointing at nothing.
func TestDocumentationLinksResolve(t *testing.T) {
	root := moduleRoot(t)
	read := func(doc string) (string, error) {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(doc)))
		return string(b), err
	}
	for _, doc := range markdownFiles(t, root) {
		for _, err := range checkLinks(root, doc, read) {
			t.Error(err)
		}
	}
}

// The link checker itself, on fixtures: each way a link can be broken is
// caught, and what is not a link is left alone.
func TestLinkCheckerCatchesBrokenLinks(t *testing.T) {
	root := moduleRoot(t)
	files := map[string]string{
		"docs/guide/page.md": "# A page\n\n## Running a job in one process (`streamctl run`)\n",
	}
	tests := []struct {
		name, md string
		want     string // substring of the error; "" for none
	}{
		{"file up and across", "[a](../../README.md)", ""},
		{"anchor in another page", "[a](page.md#running-a-job-in-one-process-streamctl-run)", ""},
		{"anchor in this page", "# Top\n\n[a](#top)", ""},
		{"external", "[a](https://example.com/x.md#nothing)", ""},
		{"inside a code span", "`[a](missing.md)`", ""},
		{"inside a fence", "```\n[a](missing.md)\n```", ""},
		{"missing file", "[a](missing.md)", "no such file"},
		{"image missing", "![a](../shot.png)", "no such file"},
		{"wrong depth", "[a](docs/architecture.md)", "no such file"},
		{"missing anchor", "[a](page.md#nowhere)", "has no heading #nowhere"},
		{"missing anchor here", "# Top\n\n[a](#bottom)", "has no heading #bottom"},
		{"out of the repository", "[a](../../../x.md)", "leaves the repository"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			read := func(doc string) (string, error) {
				if doc == "docs/guide/this.md" {
					return tt.md, nil
				}
				if s, ok := files[doc]; ok {
					return s, nil
				}
				b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(doc)))
				return string(b), err
			}
			// page.md exists only in the fixture: stat resolves against
			// the module, so use a link root where it exists.
			dir := t.TempDir()
			for _, p := range []string{"README.md", "docs/guide/page.md", "docs/guide/this.md", "docs/architecture.md"} {
				if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, p), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			errs := checkLinks(dir, "docs/guide/this.md", read)
			switch {
			case tt.want == "" && len(errs) > 0:
				t.Fatalf("unexpected errors: %v", errs)
			case tt.want != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), tt.want)):
				t.Fatalf("errors = %v, want one containing %q", errs, tt.want)
			}
		})
	}
}
