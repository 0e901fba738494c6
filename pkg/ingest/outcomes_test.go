package ingest

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Every problem code ingest can count is among Outcomes, so that its series exists from
// zero on every instance: a code added to the source and not to the list fails here.
func TestOutcomesNameEveryCountedCode(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	code := regexp.MustCompile(`(?:Code: |badRequest\(|outcome\()"([a-z_]+)"`)
	seen := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "status.go" || f == "cancel.go" { // status reads and cancels are not posts: not counted
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range code.FindAllStringSubmatch(string(src), -1) {
			seen++
			if c := m[1]; c != "not_found" && c != "method_not_allowed" && !slices.Contains(Outcomes, c) {
				t.Errorf("%s: outcome %q is not in Outcomes", f, c)
			}
		}
	}
	if seen < 10 {
		t.Fatalf("found only %d codes in the source: the pattern no longer matches it", seen)
	}
}
