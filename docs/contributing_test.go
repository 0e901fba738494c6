package docs

import (
	"os"
	"regexp"
	"testing"
)

// contributing.md's layout lists every package architecture.md's table names, so that a
// contributor finds each one by what it is for.
func TestContributingListsEveryPackage(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("contributing.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range packageRows(t) {
		if !regexp.MustCompile(`(?m)^    ` + regexp.QuoteMeta(p) + `\s`).Match(b) {
			t.Errorf("docs/contributing.md's layout does not list %s: add a line for it", p)
		}
	}
}
