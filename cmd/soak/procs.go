package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"time"

	"github.com/penguinhq/dispatcher/integration/itest"
	"github.com/penguinhq/dispatcher/pkg/freeport"
)

// proc is one of the service's processes, its output in a log file (the integration
// tests' process helper: package itest).
type proc struct {
	*itest.Proc
	name string
	ops  string // its operators' listener, for /readyz (ingest and dispatcher)
}

func startProc(dir, name, bin string, env map[string]string, args ...string) (*proc, error) {
	p, err := itest.Start(itest.Spec{Bin: bin, Args: args, Env: env, Log: filepath.Join(dir, name+".log"), DieWithParent: true})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &proc{Proc: p, name: name, ops: env["OPS_ADDR"]}, nil
}

// ready says whether the process's /readyz answers 200.
func (p *proc) ready() bool {
	return !p.Exited() && httpStatus("http://"+p.ops+"/readyz") == http.StatusOK
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
