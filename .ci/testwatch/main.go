// Command testwatch runs `go test -json` with the arguments it is given and prints what
// plain `go test` prints (each package's ok or FAIL line, and the whole output of every
// test that failed), so that CI reads the same; beside that it watches every test as it
// runs. A test that has been running (not paused waiting for its turn as a parallel test,
// not waiting on subtests of its own) for longer than -stuck without printing a line is
// called stuck: testwatch names it, sends its test binary SIGQUIT (Go prints every
// goroutine's stack and exits), and the package fails there and then, instead of at go test's -timeout many minutes
// later with nothing said of why. At the end it lists the slowest tests, so that the time
// CI takes is visible where it is spent.
//
// Usage: go run ./.ci/testwatch [-stuck 2m] [-slowest 15] -- <go test flags and packages>
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	stuck := flag.Duration("stuck", 2*time.Minute, "a test running this long without pause or a line of output is stuck: its binary is stopped and it fails")
	slowest := flag.Int("slowest", 15, "list this many of the slowest tests at the end (0: none)")
	flag.Parse()
	os.Exit(run(flag.Args(), *stuck, *slowest, os.Stdout))
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// test is what is known of one running or finished test.
type test struct {
	pkg, name string
	since     time.Time // when it last started running (run or cont); zero while paused
	done      bool
	output    strings.Builder
	elapsed   float64
}

type watcher struct {
	mu       sync.Mutex
	tests    map[string]*test // package + "\x00" + test name
	pkgOut   map[string]*strings.Builder
	stuck    time.Duration
	reported map[string]bool
	quitting map[string]bool // packages whose binary was sent SIGQUIT
	goPID    int
	out      io.Writer
}

func key(pkg, name string) string { return pkg + "\x00" + name }

func run(args []string, stuck time.Duration, slowest int, out io.Writer) int {
	cmd := exec.Command("go", append([]string{"test", "-json"}, args...)...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(out, "testwatch:", err)
		return 2
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(out, "testwatch:", err)
		return 2
	}
	w := &watcher{tests: map[string]*test{}, pkgOut: map[string]*strings.Builder{}, stuck: stuck,
		reported: map[string]bool{}, quitting: map[string]bool{}, goPID: cmd.Process.Pid, out: out}
	stop := make(chan struct{})
	go w.watch(stop)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			fmt.Fprintln(out, sc.Text()) // a build error, printed as it came
			continue
		}
		w.handle(e)
	}
	close(stop)
	rc := 0
	if err := cmd.Wait(); err != nil {
		rc = 1
		if ee, ok := err.(*exec.ExitError); ok {
			rc = ee.ExitCode()
		}
	}
	w.summary(slowest)
	if len(w.reported) > 0 && rc == 0 {
		rc = 1
	}
	return rc
}

func (w *watcher) handle(e event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.quitting[e.Package] {
		// After SIGQUIT: the goroutine dump, attributed to whichever test test2json
		// thinks is running; all of it is printed as it comes.
		fmt.Fprint(w.out, e.Output)
		return
	}
	if e.Test == "" {
		switch e.Action {
		case "output":
			b := w.pkgOut[e.Package]
			if b == nil {
				b = &strings.Builder{}
				w.pkgOut[e.Package] = b
			}
			b.WriteString(e.Output)
		case "pass", "skip":
			// Only the package's last lines, as plain go test prints them ("ok ...").
			fmt.Fprint(w.out, lastLines(w.pkgOut[e.Package], 1))
			delete(w.pkgOut, e.Package)
		case "fail":
			// Output not inside any test: a panic, a build failure, the timeout's dump.
			if b := w.pkgOut[e.Package]; b != nil {
				fmt.Fprint(w.out, b.String())
			}
			delete(w.pkgOut, e.Package)
		}
		return
	}
	k := key(e.Package, e.Test)
	t := w.tests[k]
	if t == nil {
		t = &test{pkg: e.Package, name: e.Test}
		w.tests[k] = t
	}
	switch e.Action {
	case "run", "cont":
		t.since = e.Time
		if t.since.IsZero() {
			t.since = time.Now()
		}
	case "pause":
		t.since = time.Time{}
	case "output":
		t.output.WriteString(e.Output)
		// test2json may hold a parallel test's pass back until the next line comes; the
		// report line itself says the test is over. Any other line is a sign of life (a
		// long test logs its phases): the test is stuck only after -stuck without one.
		r := strings.TrimSpace(e.Output)
		switch {
		case strings.HasPrefix(r, "--- ") && strings.Contains(r, ": "+t.name+" ("):
			t.since = time.Time{}
		case !t.since.IsZero() && !strings.HasPrefix(r, "=== "):
			t.since = time.Now()
		}
	case "pass", "skip":
		t.done, t.since, t.elapsed = true, time.Time{}, e.Elapsed
		t.output.Reset()
	case "fail":
		t.done, t.since, t.elapsed = true, time.Time{}, e.Elapsed
		// A parent's output holds only its own lines; its subtests print theirs.
		fmt.Fprint(w.out, t.output.String())
		t.output.Reset()
	}
}

// watch looks at the running tests every few seconds and stops the binary of any that
// is stuck.
func (w *watcher) watch(stop chan struct{}) {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		w.mu.Lock()
		now := time.Now()
		var stuck []*test
		for _, t := range w.tests {
			if t.done || t.since.IsZero() || now.Sub(t.since) < w.stuck || w.reported[key(t.pkg, t.name)] || w.hasLiveSubtests(t) {
				continue
			}
			stuck = append(stuck, t)
		}
		for _, t := range stuck {
			w.reported[key(t.pkg, t.name)] = true
			fmt.Fprintf(w.out, "testwatch: %s %s has been running for %s without pause or a line of output (bound %s): stopping its test binary with SIGQUIT to show where every goroutine is\n",
				t.pkg, t.name, now.Sub(t.since).Round(time.Second), w.stuck)
			fmt.Fprint(w.out, t.output.String())
			t.output.Reset()
			if !w.quitting[t.pkg] {
				w.quitting[t.pkg] = true
				w.quit(t.pkg)
			}
		}
		w.mu.Unlock()
	}
}

func (w *watcher) hasLiveSubtests(t *test) bool {
	prefix := t.name + "/"
	for _, o := range w.tests {
		if o.pkg == t.pkg && !o.done && strings.HasPrefix(o.name, prefix) {
			return true
		}
	}
	return false
}

// quit sends SIGQUIT to pkg's test binary, a descendant of go test named after the
// package's last path element.
func (w *watcher) quit(pkg string) {
	want := path.Base(pkg) + ".test"
	for _, pid := range descendants(w.goPID) {
		argv0, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		name, _, _ := strings.Cut(string(argv0), "\x00")
		if filepath.Base(name) == want {
			_ = syscall.Kill(pid, syscall.SIGQUIT)
			return
		}
	}
	fmt.Fprintf(w.out, "testwatch: found no process %s under go test (pid %d) to stop\n", want, w.goPID)
}

// descendants lists the processes below root, read from /proc.
func descendants(root int) []int {
	entries, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		s := string(stat)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 {
			parent[pid], _ = strconv.Atoi(f[1])
		}
	}
	var out []int
	for pid := range parent {
		for p := parent[pid]; p > 1; p = parent[p] {
			if p == root {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

func (w *watcher) summary(n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n <= 0 {
		return
	}
	var top []*test
	for _, t := range w.tests {
		if t.done && !strings.Contains(t.name, "/") {
			top = append(top, t)
		}
	}
	sort.Slice(top, func(i, j int) bool { return top[i].elapsed > top[j].elapsed })
	if len(top) > n {
		top = top[:n]
	}
	fmt.Fprintf(w.out, "slowest tests (seconds from start to end, parallel waits included):\n")
	for _, t := range top {
		fmt.Fprintf(w.out, "%8.1f  %s %s\n", t.elapsed, strings.TrimPrefix(t.pkg, "github.com/penguinhq/dispatcher/"), t.name)
	}
}

func lastLines(b *strings.Builder, n int) string {
	if b == nil {
		return ""
	}
	lines := strings.SplitAfter(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "") + "\n"
}
