// Package docs holds docs/architecture.md to the tree it describes.
package docs

import (
	"errors"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const root = ".."

// The package table lists every package of the tree, each once, and its rows run in
// import order: a package imports none listed below it.
func TestArchitectureListsEveryPackageInImportOrder(t *testing.T) {
	t.Parallel()
	rows := packageRows(t)
	at := map[string]int{}
	for i, p := range rows {
		if _, twice := at[p]; twice {
			t.Errorf("docs/architecture.md lists %s twice", p)
		}
		at[p] = i
	}
	dirs := packageDirs(t)
	for _, d := range dirs {
		if _, ok := at[d]; !ok {
			t.Errorf("package %s is not in docs/architecture.md's package table: add a row (in import order) saying what it is for", d)
		}
	}
	for _, p := range rows {
		if !slices.Contains(dirs, p) {
			t.Errorf("docs/architecture.md lists %s, which is no package of the tree", p)
		}
	}
	module := modulePath(t)
	for _, p := range rows {
		pkg, err := build.ImportDir(filepath.Join(root, p), 0)
		if err != nil {
			var none *build.NoGoError
			if errors.As(err, &none) {
				continue // test files only
			}
			t.Fatalf("%s: %v", p, err)
		}
		for _, imp := range pkg.Imports {
			dep, ok := strings.CutPrefix(imp, module+"/")
			if !ok {
				continue
			}
			if i, listed := at[dep]; listed && i > at[p] {
				t.Errorf("%s imports %s, which docs/architecture.md lists below it: imports run down the table", p, dep)
			}
		}
	}
}

// The binaries that only talk to NATS do not link nats-server: it is several megabytes
// and a surface they do not use.
func TestClientBinariesDoNotLinkNATSServer(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH to list the binaries' dependencies")
	}
	for _, cmd := range []string{"./cmd/ingest", "./cmd/dispatchctl", "./cmd/healthcheck"} {
		out, err := exec.Command("go", "list", "-C", root, "-deps", cmd).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", cmd, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "github.com/nats-io/nats-server") {
				t.Errorf("%s links %s: keep the embedded server in pkg/natsnode, out of what it imports", cmd, dep)
				break
			}
		}
	}
}

// The size bounds of issue 32: files and functions over them are named in the doc's
// "Sizes" section, as tables or as still to split, and a name there must still be over.
func TestNoFileOrFunctionOverItsBound(t *testing.T) {
	t.Parallel()
	const maxFileLines, maxFuncLines = 450, 80
	excepted := sizeExceptions(t)
	over := map[string]int{} // "path" or "path Func" → lines
	fset := token.NewFileSet()
	for _, dir := range packageDirs(t) {
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			rel := dir + "/" + filepath.Base(path)
			if n := fset.File(f.Pos()).LineCount(); n > maxFileLines {
				over[rel] = n
			}
			for _, d := range f.Decls {
				fn, ok := d.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > maxFuncLines {
					over[rel+" "+fn.Name.Name] = n
				}
			}
		}
	}
	for name, n := range over {
		if !excepted[name] {
			t.Errorf("%s is %d lines, over its bound (files %d, functions %d): split it, or name it in docs/architecture.md's Sizes if it is a table", name, n, maxFileLines, maxFuncLines)
		}
	}
	for name := range excepted {
		if _, ok := over[name]; !ok {
			t.Errorf("docs/architecture.md's Sizes names %s, which is within its bound now (or gone): take it off the list", name)
		}
	}
}

var sizeItem = regexp.MustCompile("^- `([^`]+)`(?: `([^`]+)`)?$")

// sizeExceptions is the names listed under "## Sizes": "path" or "path Func".
func sizeExceptions(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, line := range section(t, "## Sizes") {
		if m := sizeItem.FindStringSubmatch(line); m != nil {
			name := m[1]
			if m[2] != "" {
				name += " " + m[2]
			}
			out[name] = true
		}
	}
	return out
}

// section is the lines of architecture.md under the heading, up to the next "## ".
func section(t *testing.T, heading string) []string {
	t.Helper()
	b, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "## ") {
			in = line == heading
			continue
		}
		if in {
			lines = append(lines, line)
		}
	}
	if len(lines) == 0 {
		t.Fatalf("docs/architecture.md has no section %q", heading)
	}
	return lines
}

// Ingest and the dispatcher see the queue through their ports (the interfaces they
// declare, with the shared words of pkg/request), so that their tests and the
// simulation can hold them to fakes and the conformance suites hold the fakes to the
// queue.
func TestIngestAndDispatchDoNotImportTheQueue(t *testing.T) {
	t.Parallel()
	module := modulePath(t)
	for _, p := range []string{"pkg/ingest", "pkg/dispatch"} {
		pkg, err := build.ImportDir(filepath.Join(root, p), 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range pkg.Imports {
			if imp == module+"/pkg/queue" || strings.HasPrefix(imp, "github.com/nats-io/") {
				t.Errorf("%s imports %s: it sees the queue through its ports", p, imp)
			}
		}
	}
}

var rowPath = regexp.MustCompile("^\\| `([^`]+)` \\|")

// packageRows is the first column of the table under "## Packages", in order.
func packageRows(t *testing.T) []string {
	t.Helper()
	var rows []string
	for _, line := range section(t, "## Packages") {
		if m := rowPath.FindStringSubmatch(line); m != nil {
			rows = append(rows, m[1])
		}
	}
	if len(rows) == 0 {
		t.Fatal("docs/architecture.md has no package table under \"## Packages\"")
	}
	return rows
}

// packageDirs is every directory of the tree that holds Go files, as `go ./...` sees
// them (no hidden directories, no testdata).
func packageDirs(t *testing.T) []string {
	t.Helper()
	seen := map[string]bool{}
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		dir, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		dir = filepath.ToSlash(dir)
		if !seen[dir] && dir != "." {
			seen[dir] = true
			dirs = append(dirs, dir)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

func modulePath(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if m, ok := strings.CutPrefix(line, "module "); ok {
			return strings.TrimSpace(m)
		}
	}
	t.Fatal("go.mod names no module")
	return ""
}
