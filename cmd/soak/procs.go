package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/penguinhq/dispatcher/pkg/freeport"
)

// proc is one of the service's processes, its output in a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	ops  string // its operators' listener, for /readyz (ingest and dispatcher)
}

func startProc(dir, name, bin string, env map[string]string, args ...string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LOG_FORMAT=json", "LOG_LEVEL=info"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{}), ops: env["OPS_ADDR"]}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// send sends sig without waiting.
func (p *proc) send(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

// stop sends sig and waits up to d for the process to exit, then kills it.
func (p *proc) stop(sig syscall.Signal, d time.Duration) {
	if !p.alive() {
		return
	}
	p.send(sig)
	select {
	case <-p.done:
	case <-time.After(d):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// ready says whether the process's /readyz answers 200.
func (p *proc) ready() bool {
	return p.alive() && httpStatus("http://"+p.ops+"/readyz") == http.StatusOK
}

// logLines returns the JSON lines of the process's log whose message is one of msgs.
func (p *proc) logLines(msgs ...string) []map[string]any {
	f, err := os.Open(p.log)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var m map[string]any
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		text, _ := m["message"].(string)
		for _, msg := range msgs {
			if strings.HasPrefix(text, msg) {
				out = append(out, m)
				break
			}
		}
	}
	return out
}

var client = &http.Client{Timeout: 2 * time.Second}

func httpStatus(url string) int {
	resp, err := client.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// freeAddr returns a loopback address with a port that was free a moment ago, below the
// ephemeral range: a node restarted by a fault binds it again.
func freeAddr() (string, error) { return freeport.Loopback() }
