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
// ends, and lists what it asks for once the watch covers it.
func (l *loop) keepWatch(ctx context.Context) {
	began := time.Now()
	var covered []int
	stop := func() {}
	defer func() { stop() }()
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
		switch {
		case slices.Equal(open, covered):
		case len(open) == 0:
			stop()
			stop, covered = func() {}, nil
		default:
			// The new watch first: the old one goes on meanwhile, and gives what the new
			// one gives too for a while (a lane noted twice is noted once).
			next, err := l.d.src.Watch(ctx, open, l.noteLane(ctx), l.watchTrouble(began))
			if err != nil {
				if ctx.Err() == nil {
					l.d.log.Warn().Err(err).Ints("partitions", open).Msg("starting the backlog watch failed; will retry, and list the backlog meanwhile")
				}
				l.watch.keep(list)
				l.askResync()
				retry.Reset(time.Second)
				continue
			}
			stop()
			stop, covered = next, open
			for _, p := range open {
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
