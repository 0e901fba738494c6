package queue

import (
	"testing"
	"time"
)

// A writer takes the way that has cost less per message lately, tries the other once a
// second, never takes a small batch or a refused stream atomically, and a pause of the
// process does not turn it.
func TestWriteCostsChooseTheCheaperWay(t *testing.T) {
	var c writeCosts
	now := time.Unix(1000, 0)
	if c.atomicNext(atomicMin-1, false, now) {
		t.Fatal("a batch smaller than atomicMin went atomically")
	}
	if !c.atomicNext(100, false, now) {
		t.Fatal("the first batch did not measure the atomic way")
	}
	c.note(true, 100, 5*time.Millisecond) // 50 us an event
	if c.atomicNext(100, false, now) {
		t.Fatal("the second batch did not measure the other way")
	}
	c.note(false, 100, 20*time.Millisecond) // 200 us an event: a synced disk
	if !c.atomicNext(100, false, now) {
		t.Fatal("the cheaper atomic way was not chosen")
	}
	if c.atomicNext(100, true, now) {
		t.Fatal("a stream that refuses atomic batches got one")
	}
	// Once a second the dearer way is tried again, and believed at once if cheaper now.
	later := now.Add(costsRetry)
	if c.atomicNext(100, false, later) {
		t.Fatal("the dearer way was not tried after a second")
	}
	c.note(false, 100, 2*time.Millisecond) // the disk no longer syncs each write
	if c.atomicNext(100, false, later) {
		t.Fatal("a way found cheaper was not taken at once")
	}
	// A pause of the process (100 ms for one batch) moves the estimate by at most a
	// quarter, so the way stays.
	c.note(false, 100, 100*time.Millisecond)
	if c.each > 25e-6 || c.atomicNext(100, false, later) {
		t.Fatalf("one slow batch turned the writer (each: %v s an event)", c.each)
	}
	// A lasting change does turn it.
	for range 10 {
		c.note(false, 100, 20*time.Millisecond)
	}
	if !c.atomicNext(100, false, later) {
		t.Fatalf("a lasting change did not turn the writer (each: %v s an event)", c.each)
	}
}
