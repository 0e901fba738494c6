package dispatchsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/raven"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// The ports an instance reaches the world through; faults are drawn per port.
const (
	portStore  = "store"
	portList   = "list"
	portQueue  = "queue"
	portEvents = "events"
	portRaven  = "raven"
)

// errKilled is what a call of a killed instance answers: the process is gone.
var errKilled = errors.New("simulated fault: the instance was killed")

// Instance is one dispatcher process: the real dispatch.Dispatcher, with the real raven
// client, reaching the simulated store, queue, events and raven through ports that add
// the faults drawn for it. It can be paused (as SIGSTOP: nothing it sends leaves it, and
// nothing it is sent reaches it, until it is resumed), killed (as SIGKILL: what it sent
// before still lands; nothing after) and stopped gracefully.
type Instance struct {
	w    *World
	id   string
	name string // id and incarnation: i2, i2#2 after a restart with the same id

	mu      sync.Mutex
	running chan struct{} // closed while not paused
	paused  int           // pauses under way
	dead    chan struct{} // closed once killed
	killed  bool
	pauses  []span

	cancel context.CancelFunc
	done   chan struct{} // Run returned
	d      *dispatch.Dispatcher
}

// span is an interval of simulated time.
type span struct{ from, to time.Time }

func newInstance(w *World, id, name string) *Instance {
	in := &Instance{w: w, id: id, name: name, running: make(chan struct{}), dead: make(chan struct{}), done: make(chan struct{})}
	close(in.running)
	return in
}

// start runs the real dispatcher until the instance is stopped or killed.
func (in *Instance) start() error {
	w := in.w
	snd, err := raven.New(raven.Config{URL: "http://raven.sim/hook", Timeout: w.cfg.SendTimeout, Transport: &ravenPort{in: in}})
	if err != nil {
		return err
	}
	cfg := w.cfg
	cfg.InstanceID = in.id
	cfg.Leases = &StoreView{s: w.store, in: in}
	cfg.Events = &eventsPort{in: in}
	log := zerolog.New(&logSink{in: in}).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	d, err := dispatch.New(cfg, &QueueView{q: w.queue, in: in}, snd, log)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	in.cancel, in.d = cancel, d
	go func() {
		defer close(in.done)
		if err := d.Run(ctx); err != nil && ctx.Err() == nil {
			w.note("%s: Run returned %v", in.name, err)
		}
	}()
	return nil
}

// pause stops the instance's traffic until resume. Pauses may overlap: the instance runs
// again once every one of them has ended.
func (in *Instance) pause() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.paused++; in.paused == 1 {
		in.running = make(chan struct{})
		in.pauses = append(in.pauses, span{from: time.Now()})
	}
}

func (in *Instance) resume() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.paused == 0 {
		return
	}
	if in.paused--; in.paused == 0 {
		close(in.running)
		in.pauses[len(in.pauses)-1].to = time.Now()
	}
}

// kill ends the process at once: its calls under way are cut, later ones never leave it.
func (in *Instance) kill() {
	in.mu.Lock()
	if !in.killed {
		in.killed = true
		close(in.dead)
	}
	for in.paused > 0 {
		in.paused = 1
		in.mu.Unlock()
		in.resume()
		in.mu.Lock()
	}
	in.mu.Unlock()
	in.cancel()
	<-in.done
}

// stop ends the process gracefully: it drains and hands its leases back.
func (in *Instance) stop() {
	in.mu.Lock()
	if in.paused > 0 {
		in.paused = 1
		in.mu.Unlock()
		in.resume()
	} else {
		in.mu.Unlock()
	}
	in.cancel()
	<-in.done
}

// pausedWithin says whether the instance was paused at some time within [from, to].
func (in *Instance) pausedWithin(from, to time.Time) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, p := range in.pauses {
		end := p.to
		if end.IsZero() {
			end = time.Now()
		}
		if !p.from.After(to) && !end.Before(from) {
			return true
		}
	}
	return false
}

func (in *Instance) isDead() bool {
	select {
	case <-in.dead:
		return true
	default:
		return false
	}
}

// awake waits until the instance is not paused: false if it was killed, or ctx ended.
func (in *Instance) awake(ctx context.Context) error {
	in.mu.Lock()
	running := in.running
	in.mu.Unlock()
	select {
	case <-running:
	case <-in.dead:
		return errKilled
	case <-ctx.Done():
		return ctx.Err()
	}
	if in.isDead() {
		return errKilled
	}
	return nil
}

// call makes one call to the world: it leaves only once the instance runs, fails at once
// when the faults refuse it, and otherwise lands after the drawn latency whether or not
// the caller still waits (a call that timed out may land: its message was on the wire).
// Its answer reaches the instance once it runs again.
func (in *Instance) call(ctx context.Context, port, what string, key int, apply func()) error {
	if err := in.awake(ctx); err != nil {
		return err
	}
	f := in.w.draw(in, port, what, key)
	if f.refuse {
		if !sleepCtx(ctx, f.latency) {
			return ctx.Err()
		}
		return errRefused
	}
	landed := make(chan struct{})
	go func() {
		if f.hang || !sleepCtx(in.w.ctx, f.latency) {
			return
		}
		apply()
		close(landed)
	}()
	select {
	case <-landed:
	case <-ctx.Done():
		return ctx.Err()
	case <-in.dead:
		return errKilled
	}
	return in.awake(ctx)
}

// sleepCtx sleeps for d unless ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// eventsPort is the event writer: Record never waits, WriteNow waits for the write as
// long as the faults make it, up to ctx. A final event's write that lands, even after
// WriteNow gave up waiting, makes it stored.
type eventsPort struct{ in *Instance }

func (e *eventsPort) Record(request.Event) {}

func (e *eventsPort) WriteNow(ctx context.Context, ev request.Event) bool {
	return e.in.call(ctx, portEvents, "write", int(ev.Seq), func() { e.in.w.finalStored(ev) }) == nil
}

// logSink keeps what a failure's report shows of the dispatcher's log: lines about leases
// and partitions, and those naming a request whose delivery raven may see twice.
type logSink struct{ in *Instance }

func (s *logSink) Write(p []byte) (int, error) {
	w := s.in.w
	var line struct {
		Message string `json:"message"`
		Request string `json:"request_id"`
		Level   string `json:"level"`
	}
	if bytes.Contains(p, []byte(dispatch.LogRemovalFailed)) || bytes.Contains(p, []byte(dispatch.LogRemovalLate)) ||
		bytes.Contains(p, []byte("lease")) || bytes.Contains(p, []byte("partition")) {
		if json.Unmarshal(p, &line) == nil {
			w.note("%s %s: %s", s.in.name, line.Level, bytes.TrimSpace(p))
		}
	}
	return len(p), nil
}
