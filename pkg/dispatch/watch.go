package dispatch

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// The backlog watch gives the loop the lane of each new request in the partitions open
// to this instance's attempts, and of no other: N instances sharing the partitions are
// not each sent every request. It is started again, over the new set, when the set
// changes, by a goroutine of its own (the queue's answer must not hold up the loop).
//
// Nothing is missed across a change. A partition taken is listed once the watch that
// covers it has started: a request stored before that start is in the listing, one
// after it comes through the watch. The watch started again may not give what the one
// it replaces held on its way when stopped, so every partition it covers is listed
// again then.

// watchGap is the least time between two starts of the watch: the changes of a
// rebalance, a partition at a time, are taken together.
const watchGap = 250 * time.Millisecond

// watchStartQuiet is how long after the backlog watch starts its trouble is logged at
// info, not warn.
const watchStartQuiet = 30 * time.Second

// watchPlan is what the loop asks of the watch: the partitions it should cover, and
// those to list once it does. The loop writes it, keepWatch reads it.
type watchPlan struct {
	mu   sync.Mutex
	open []int        // the partitions to watch, the latest the loop asked for
	list map[int]bool // partitions to list once the watch covers them
	wake chan struct{}
}

func newWatchPlan() *watchPlan {
	return &watchPlan{list: map[int]bool{}, wake: make(chan struct{}, 1)}
}

// want asks for a watch of open, and for list to be listed once it covers them.
func (w *watchPlan) want(open []int, list ...int) {
	w.mu.Lock()
	w.open = open
	for _, p := range list {
		w.list[p] = true
	}
	w.mu.Unlock()
	w.poke()
}

func (w *watchPlan) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// take returns what is asked now, and forgets the listings asked for.
func (w *watchPlan) take() (open []int, list map[int]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	open, list = w.open, w.list
	w.list = map[int]bool{}
	return open, list
}

// keep asks again for listings that could not be made yet.
func (w *watchPlan) keep(list map[int]bool) {
	w.mu.Lock()
	maps.Copy(w.list, list)
	w.mu.Unlock()
}

// watchOpen asks for the backlog watch to cover the partitions open to attempts now, and
// for listings of taken once it does.
func (l *loop) watchOpen(taken ...int) {
	open := make([]int, 0, len(l.owned))
	for p, part := range l.owned {
		if part.open() {
			open = append(open, p)
		}
	}
	slices.Sort(open)
	l.watch.want(open, taken...)
}

// keepWatch keeps the backlog watch over the partitions the loop asks for until ctx
// ends, and lists what it asks for once the watch covers it. It closes done once its
// watch is stopped.
func (l *loop) keepWatch(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	w := backlogWatch{stop: func() {}, began: time.Now()}
	defer func() { w.stop() }()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.watch.wake:
		case <-retry.C:
		}
		open, list := l.watch.take()
		if !slices.Equal(open, w.covered) {
			if err := l.restartWatch(ctx, &w, open); err != nil {
				l.watch.keep(list)
				retry.Reset(watchRetry(w.failures))
				continue
			}
			for _, p := range open { // what the stopped watch still held reaches neither
				list[p] = true
			}
		}
		for p := range list {
			l.list(p)
		}
		select { // let a rebalance's next changes gather
		case <-ctx.Done():
			return
		case <-time.After(watchGap):
		}
	}
}

// backlogWatch is keepWatch's state: the watch running, over which partitions, and how
// many starts have failed in a row.
type backlogWatch struct {
	covered  []int
	stop     func()
	failures int
	began    time.Time
}

// restartWatch starts the watch over open (none: stops it). The new watch starts before
// the old one stops, which saves the listings a wait; the old one is stopped off this
// goroutine, as a consumer being created again (a node lost) holds its stop for seconds.
func (l *loop) restartWatch(ctx context.Context, w *backlogWatch, open []int) error {
	if len(open) == 0 {
		go w.stop()
		w.stop, w.covered = func() {}, nil
		return nil
	}
	next, err := l.d.src.Watch(ctx, open, l.noteLane(ctx), l.watchTrouble(w.began))
	if err != nil {
		w.failures++
		if ctx.Err() == nil && (w.failures == 1 || w.failures%30 == 0) {
			l.d.log.Warn().Err(err).Ints("partitions", open).Int("failures", w.failures).Msg("starting the backlog watch failed; will retry, and list the backlog meanwhile")
		}
		if w.failures == 1 {
			l.askResync() // then the resync timer's listings, until the watch starts
		}
		return err
	}
	if w.failures > 0 {
		l.d.log.Info().Int("failures", w.failures).Msg("backlog watch started again")
	}
	w.failures = 0
	go w.stop()
	w.stop, w.covered = next, open
	return nil
}

// watchRetry is how long to wait before starting the watch again after failures in a
// row: a second, doubling, at most 30 s.
func watchRetry(failures int) time.Duration {
	return min(time.Second<<min(max(failures-1, 0), 5), 30*time.Second)
}

// noteLane passes the lane of a new request to the loop.
func (l *loop) noteLane(ctx context.Context) func(request.Lane) {
	return func(lane request.Lane) {
		select {
		case l.notes <- lane:
		case <-ctx.Done():
		}
	}
}

// watchTrouble asks for a listing of the backlog when the watch may have missed some.
func (l *loop) watchTrouble(began time.Time) func(error) {
	return func(err error) {
		// Nothing is lost (the backlog is listed again). A cluster starting with the
		// services elects its stream leaders for a while, and the watch's consumer may
		// not be answered meanwhile: that is no cause for a warning yet.
		ev := l.d.log.Warn()
		if time.Since(began) < watchStartQuiet {
			ev = l.d.log.Info()
		}
		ev.Err(err).Msg("backlog watch trouble; listing the backlog again")
		l.askResync()
	}
}
