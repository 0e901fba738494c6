package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every test SECURITY.md's credential table names exists: a line of that table is only
// as good as the test behind it.
func TestSecurityTableNamesRealTests(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join(root, "SECURITY.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "## Credentials: what each can and cannot do")
	if !ok {
		t.Fatal("SECURITY.md has no section \"Credentials: what each can and cannot do\"")
	}
	table, _, _ = strings.Cut(table, "\n## ")
	named := regexp.MustCompile("`(Test[A-Za-z0-9_]+)`").FindAllStringSubmatch(table, -1)
	if len(named) < 10 {
		t.Fatalf("SECURITY.md's credential table names %d tests; each line names the tests that back it", len(named))
	}
	defined := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range named {
		if !defined[m[1]] {
			t.Errorf("SECURITY.md's credential table names %s, which no test file defines", m[1])
		}
	}
}
