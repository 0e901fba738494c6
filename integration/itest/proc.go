package itest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Spec says how to start one of the service's binaries as its own process.
type Spec struct {
	Bin  string
	Args []string
	// Env is added to the process's environment, which holds only PATH, JSON logs at
	// level info and an operators' listener on any free loopback port (OPS_ADDR) unless
	// Env says otherwise.
	Env map[string]string
	// Log, if set, is a file the process's output is appended to (a soak's processes log
	// for hours); otherwise the output is kept in memory.
	Log string
	// DieWithParent kills the process when the one that started it dies (Linux), so that
	// an interrupted soak leaves no service running.
	DieWithParent bool
}

// Proc is one of the service's binaries running as its own process.
type Proc struct {
	cmd  *exec.Cmd
	log  string  // the output's file, or
	mem  *Buffer // the output kept in memory
	done chan struct{}
}

// Start starts the process described by s.
func Start(s Spec) (*Proc, error) {
	cmd := exec.Command(s.Bin, s.Args...)
	// Later entries win: Env may set any of these.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LOG_FORMAT=json", "LOG_LEVEL=info", "OPS_ADDR=127.0.0.1:0"}
	for k, v := range s.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &Proc{cmd: cmd, log: s.Log, done: make(chan struct{})}
	var f *os.File
	if s.Log != "" {
		var err error
		if f, err = os.OpenFile(s.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = f, f
	} else {
		p.mem = &Buffer{}
		cmd.Stdout, cmd.Stderr = p.mem, p.mem
	}
	if s.DieWithParent {
		cmd.SysProcAttr = dieWithParent()
	}
	if err := cmd.Start(); err != nil {
		if f != nil {
			f.Close()
		}
		return nil, fmt.Errorf("starting %s: %w", s.Bin, err)
	}
	go func() {
		_ = cmd.Wait()
		if f != nil {
			f.Close()
		}
		close(p.done)
	}()
	return p, nil
}

// Pid is the process's id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has ended.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited says whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ExitCode is the process's exit code once it has ended (-1 for a signal), else -1.
func (p *Proc) ExitCode() int {
	if !p.Exited() {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// Signal sends sig and returns at once (SIGSTOP, SIGCONT).
func (p *Proc) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop sends sig and waits up to d for the process to end, then kills it. It says
// whether the process ended by itself within d (true also when it had ended before).
func (p *Proc) Stop(sig syscall.Signal, d time.Duration) bool {
	if p.Exited() {
		return true
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		_ = p.cmd.Process.Kill()
		<-p.done
		return false
	}
}

// Output is what the process has printed so far.
func (p *Proc) Output() string {
	if p.mem != nil {
		return p.mem.String()
	}
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// LogLines is the process's JSON log lines whose message starts with one of msgs.
func (p *Proc) LogLines(msgs ...string) []map[string]any {
	if p.mem != nil {
		return LogLines(strings.NewReader(p.mem.String()), msgs...)
	}
	f, err := os.Open(p.log)
	if err != nil {
		return nil
	}
	defer f.Close()
	return LogLines(f, msgs...)
}

// LogLines is the JSON log lines read from r whose message starts with one of msgs
// (every one for ""); lines that are not JSON are passed over.
func LogLines(r io.Reader, msgs ...string) []map[string]any {
	var out []map[string]any
	br := bufio.NewReader(r) // lines of any length: a scanner's cap would end the read early
	for {
		line, err := br.ReadBytes('\n')
		if err != nil && len(line) == 0 {
			return out
		}
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
}

// Buffer is a bytes.Buffer that many goroutines may write (a process, a logger) while a
// test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
