package atomicfile_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/weirstream/weir/internal/atomicfile"
)

func TestWriteReplacesTheFileAndLeavesNoTemporary(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	for _, content := range []string{"first", "second, longer"} {
		if err := atomicfile.Write(path, []byte(content)); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != content {
			t.Fatalf("read %q, %v; want %q", got, err, content)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) != 1 {
		t.Fatalf("directory holds %v (%v), want only the file", ents, err)
	}
}

func TestWriteIntoAMissingDirectoryFailsNamingThePath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "f")
	if err := atomicfile.Write(path, []byte("x")); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
}
