package lint

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// submitWaitThenMore returns the lines of md's fenced code blocks where a
// `streamctl submit ... --wait` is followed by another command in the same
// block: --wait follows the job until it ends, and a streaming job never
// does, so the commands after it never run.
func submitWaitThenMore(md string) []int {
	var bad []int
	fenced, waiting := false, 0
	sc := bufio.NewScanner(strings.NewReader(md))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "```") {
			fenced, waiting = !fenced, 0
			continue
		}
		if !fenced || line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if waiting != 0 {
			bad = append(bad, waiting)
			waiting = 0
		}
		cmd, _, _ := strings.Cut(line, " #")
		if strings.Contains(cmd, "streamctl submit") && strings.Contains(cmd, "--wait") && !strings.HasSuffix(cmd, "&") {
			waiting = n
		}
	}
	return bad
}

// No documented command block runs `submit --wait` and then more commands:
// on a streaming job they would never run (a new user's first cluster
// block waited forever before its `list`).
func TestDocumentedSubmitWaitIsTheLastCommandOfItsBlock(t *testing.T) {
	root := moduleRoot(t)
	for _, doc := range markdownFiles(t, root) {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(doc)))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range submitWaitThenMore(string(b)) {
			t.Errorf("%s:%d: `streamctl submit --wait` is followed by more commands, which never run while it follows a streaming job", doc, n)
		}
	}
}

func TestSubmitWaitCheckCatchesCommandsAfterIt(t *testing.T) {
	tests := []struct {
		md   string
		want []int
	}{
		{"```sh\nstreamctl submit wordcount --wait\nstreamctl list\n```\n", []int{2}},
		{"```sh\nstreamctl submit nexmark --wait\n```\nstreamctl list\n", nil},
		{"```sh\nstreamctl submit wordcount\nstreamctl list\n```\n", nil},
		{"```sh\nstreamctl submit nexmark --wait &\nstreamctl list\n```\n", nil},
		{"```sh\nstreamctl submit nexmark --wait   # bounded\n\n# then\nstreamctl list\n```\n", []int{2}},
	}
	for _, tt := range tests {
		if got := submitWaitThenMore(tt.md); fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("%q: lines %v, want %v", tt.md, got, tt.want)
		}
	}
}
