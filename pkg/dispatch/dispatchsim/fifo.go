package dispatchsim

import "sync"

// fifo hands what is pushed to one reader, in order, without ever holding up the
// pusher: a watch's deliveries (lease changes, subjects of new requests), read by the
// watch's own goroutine.
type fifo[T any] struct {
	mu      sync.Mutex
	queue   []T
	wake    chan struct{}
	stopped chan struct{}
	once    sync.Once
}

func newFIFO[T any]() *fifo[T] {
	return &fifo[T]{wake: make(chan struct{}, 1), stopped: make(chan struct{})}
}

func (f *fifo[T]) push(v T) {
	f.mu.Lock()
	f.queue = append(f.queue, v)
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *fifo[T]) stop() { f.once.Do(func() { close(f.stopped) }) }

// done says whether the fifo was stopped.
func (f *fifo[T]) done() bool {
	select {
	case <-f.stopped:
		return true
	default:
		return false
	}
}

// next waits for the next value; false once stopped.
func (f *fifo[T]) next() (T, bool) {
	for {
		select {
		case <-f.stopped:
			var zero T
			return zero, false
		default:
		}
		f.mu.Lock()
		if len(f.queue) > 0 {
			v := f.queue[0]
			f.queue = f.queue[1:]
			f.mu.Unlock()
			return v, true
		}
		f.mu.Unlock()
		select {
		case <-f.wake:
		case <-f.stopped:
			var zero T
			return zero, false
		}
	}
}
