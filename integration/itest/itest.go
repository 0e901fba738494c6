// Package itest holds what the integration test packages and the soak (cmd/soak) share:
// the service's binaries built and run as processes with their logs (proc.go), waiting
// with a deadline, free loopback ports, reading a /metrics page. It is for tests and the
// soak only.
package itest

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/freeport"
)

// WaitFor polls cond until it holds or the deadline passes. A deadline here bounds a
// hang, it does not judge speed: make it generous (the machines are shared, and run
// the race detector), and keep cond itself from blocking for long (HTTP below uses a
// client with a timeout).
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	WaitForState(t, timeout, what, func() (bool, string) { return cond(), "" })
}

// WaitForState is WaitFor for a cond that also says what it saw: on timeout the last
// thing seen is part of the failure.
func WaitForState(t testing.TB, timeout time.Duration, what string, cond func() (done bool, seen string)) {
	t.Helper()
	start, told := time.Now(), time.Now()
	if ok, seen := Poll(timeout, func() (bool, string) {
		done, seen := cond()
		// Every 30 s a line of where it stands: CI's stuck-test watch reads it as a sign
		// of life, and a slow run says what it waited for.
		if !done && time.Since(told) >= 30*time.Second {
			told = time.Now()
			t.Logf("still waiting after %s for %s; seen: %s", time.Since(start).Round(time.Second), what, seen)
		}
		return done, seen
	}); !ok {
		if seen != "" {
			seen = "; last seen: " + seen
		}
		t.Fatalf("timed out after %s (bound %s) waiting for %s%s", time.Since(start).Round(time.Millisecond), timeout, what, seen)
	}
	// A long wait is worth a line: it says where a slow run spent its time, and CI's
	// stuck-test watch reads a line as a sign of life.
	if took := time.Since(start); took >= 10*time.Second {
		t.Logf("waited %s for %s", took.Round(time.Millisecond), what)
	}
}

// Poll calls cond until it holds (true) or the timeout passes (false), and returns what
// cond saw last.
func Poll(timeout time.Duration, cond func() (done bool, seen string)) (bool, string) {
	deadline := time.Now().Add(timeout)
	for {
		done, seen := cond()
		if done || time.Now().After(deadline) {
			return done, seen
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// HTTP is the client for tests' own requests to the service: an answer that does not
// come within its timeout is an error, not a test that hangs.
var HTTP = &http.Client{Timeout: 10 * time.Second}

// WaitReady waits until base's /readyz answers 200.
func WaitReady(t testing.TB, base string) {
	t.Helper()
	WaitForState(t, 60*time.Second, base+" readyz", func() (bool, string) {
		resp, err := HTTP.Get(base + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return resp.StatusCode == 200, fmt.Sprintf("%d %s", resp.StatusCode, body)
	})
}

// FreeAddr returns a loopback address with a port that was free a moment ago, chosen
// below the kernel's ephemeral range (package freeport says why): tests stop and start
// servers on these addresses.
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// MustContain fails t unless out says want.
func MustContain(t testing.TB, out, want string) {
	t.Helper()
	if !strings.Contains(out, want) {
		t.Fatalf("output does not say %q:\n%s", want, out)
	}
}

// ClientName is the i-th test client's id.
func ClientName(i int) string { return fmt.Sprintf("client-%03d", i) }

// ScrapeQuiet reads a /metrics page; empty when it cannot be read.
func ScrapeQuiet(url string) map[string]float64 {
	m, err := ReadMetrics(url)
	if err != nil {
		return map[string]float64{}
	}
	return m
}

// ReadMetrics reads a /metrics page: each series (name and labels) with its value.
func ReadMetrics(url string) (map[string]float64, error) {
	resp, err := HTTP.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	return ParseMetrics(resp.Body)
}

// ParseMetrics reads Prometheus text format: each series with its value.
func ParseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// BuildBinaries builds the named commands of this module (cmd/<name>) into a new
// temporary directory and returns it; for a TestMain, which removes it at the end.
func BuildBinaries(names ...string) (dir string, err error) {
	dir, err = os.MkdirTemp("", "dispatcher-bin-")
	if err != nil {
		return "", err
	}
	if err := Build(dir, os.Stderr, names...); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// Build builds the named commands of this module (cmd/<name>) into dir, printing what
// the build prints to out. It runs from anywhere inside the module.
func Build(dir string, out io.Writer, names ...string) error {
	args := []string{"build", "-o", dir + string(os.PathSeparator)}
	for _, n := range names {
		args = append(args, "github.com/penguinhq/dispatcher/cmd/"+n)
	}
	build := exec.Command("go", args...)
	build.Stdout, build.Stderr = out, out
	if err := build.Run(); err != nil {
		return fmt.Errorf("building %s (run from inside the module): %w", strings.Join(names, ", "), err)
	}
	return nil
}
