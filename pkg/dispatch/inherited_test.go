package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// memAttempts is an AttemptRecord that says the same of every request, and counts the
// reads.
type memAttempts struct {
	mu     sync.Mutex
	n      int
	first  time.Time
	err    error
	reads  []string
	during func() // called within the read, if set
}

func (m *memAttempts) EarlierAttempts(_ context.Context, st request.Stored) (int, time.Time, error) {
	if m.during != nil {
		m.during()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads = append(m.reads, st.ID)
	return m.n, m.first, m.err
}

func (m *memAttempts) read() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.reads...)
}

// A head that an earlier owner of its client attempted three times, taken over by this
// instance (queued before the lane's fence, no attempt of the lane since): its first
// attempt here is the 4th, the last of MaxAttempts 4, and its dead letter counts 4 from
// the earlier first attempt. Before, it was attempt 1 with the whole budget again: a
// request that kept failing held its client's queue for as long as takeovers came.
func TestATakenOverHeadCountsOnFromItsEarlierAttempts(t *testing.T) {
	t.Parallel()
	rec := &memAttempts{n: 3, first: start.Add(-time.Hour)}
	b := setup(t, Config{Policy: schedule.Policy{MaxAttempts: 4}, Attempts: rec})
	subj := laneOf(1, "kai")
	b.src.add(subj, "r1", start.Add(-2*time.Hour))
	b.snd.answer = func(request.Stored, int) error { return &request.TransientError{Status: 503} }
	job := b.job(subj)
	job.Since = start.Add(-time.Second) // this instance took the client a second ago
	if res := b.d.work(context.Background(), job, time.Time{}); res.Kind != schedule.DeadLettered {
		t.Fatalf("result %+v, want DeadLettered: the 4th attempt of 4 failed", res)
	}
	if a := b.snd.attempts(); len(a) != 1 || a[0].attempt != 4 {
		t.Fatalf("attempts %+v, want one, numbered 4", a)
	}
	dead := b.src.deadLetters()
	if len(dead) != 1 || dead[0].why.Reason != request.ReasonAttemptsExhausted || dead[0].why.Attempts != 4 || !dead[0].why.FirstAttempt.Equal(rec.first) {
		t.Fatalf("dead letter %+v, want attempts_exhausted after 4, the first attempt an hour ago", dead)
	}
	if got := rec.read(); len(got) != 1 || got[0] != "r1" {
		t.Fatalf("record read for %v, want r1 once", got)
	}
	if !strings.Contains(b.log.String(), "counting on from them") {
		t.Errorf("log does not say the head was taken over after earlier attempts:\n%s", b.log)
	}
}

// The record is read only where an earlier owner may have attempted the head: the lane
// made no attempt since its fence, and the head was queued before the fence (give or
// take a second for the store's clock against this instance's). For the head the lane
// already counts for (a lane that outlived an earlier holding of its partition), the
// higher count of the two is taken. A record that cannot be read counts from what it
// gave.
func TestEarlierAttemptsAreReadOnlyForATakenOverHead(t *testing.T) {
	t.Parallel()
	fence := start.Add(-time.Second)
	for _, c := range []struct {
		name    string
		queued  time.Time // when the head was queued
		prevEnd time.Time // the lane's last attempt's end
		counted int       // attempts the lane counts for this head already
		err     error
		read    bool
		attempt int
	}{
		{name: "queued before the fence", queued: start.Add(-time.Minute), read: true, attempt: 3},
		{name: "queued long after the fence", queued: fence.Add(2 * time.Second), read: false, attempt: 1},
		{name: "queued just after the fence, within the clocks apart", queued: fence.Add(500 * time.Millisecond), read: true, attempt: 3},
		{name: "the lane attempted since the fence", queued: start.Add(-time.Minute), prevEnd: fence.Add(time.Millisecond), read: false, attempt: 1},
		{name: "the lane counts fewer for it", queued: start.Add(-time.Minute), counted: 1, read: true, attempt: 3},
		{name: "the lane counts more for it", queued: start.Add(-time.Minute), counted: 5, read: true, attempt: 6},
		{name: "the record unreadable", queued: start.Add(-time.Minute), err: errors.New("timeout"), read: true, attempt: 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rec := &memAttempts{n: 2, first: start.Add(-time.Hour), err: c.err}
			b := setup(t, Config{Attempts: rec})
			subj := laneOf(2, "lou")
			st := b.src.add(subj, "r1", c.queued)
			job := b.job(subj)
			job.Since, job.PrevEnd = fence, c.prevEnd
			if c.counted > 0 {
				job.HeadSeq, job.Attempts, job.FirstAttempt = st.Seq, c.counted, start.Add(-time.Minute)
			}
			b.d.work(context.Background(), job, time.Time{})
			if got := len(rec.read()) > 0; got != c.read {
				t.Errorf("record read: %v, want %v", got, c.read)
			}
			if a := b.snd.attempts(); len(a) != 1 || a[0].attempt != c.attempt {
				t.Errorf("attempts %+v, want one numbered %d", a, c.attempt)
			}
		})
	}
}

// A head whose record shows MaxAttempts attempts (its last one's outcome unknown: only
// an attempt_started says it was made) gets one more attempt, not a dead letter: raven
// may have taken it. A head that changed during the read is not sent: the lane looks
// again.
func TestATakenOverHeadIsNotGivenUpUnsent(t *testing.T) {
	t.Parallel()
	rec := &memAttempts{n: 3, first: start.Add(-time.Hour)}
	b := setup(t, Config{Policy: schedule.Policy{MaxAttempts: 3}, Attempts: rec})
	subj := laneOf(3, "max")
	b.src.add(subj, "unknown", start.Add(-time.Minute))
	job := b.job(subj)
	job.Since = start.Add(-time.Second)
	if res := b.d.work(context.Background(), job, time.Time{}); res.Kind != schedule.Delivered {
		t.Fatalf("result %+v, want Delivered (raven takes it)", res)
	}
	if a := b.snd.attempts(); len(a) != 1 || a[0].attempt != 4 {
		t.Fatalf("attempts %+v, want one, numbered 4", a)
	}

	rec = &memAttempts{n: 1}
	b = setup(t, Config{Attempts: rec})
	st := b.src.add(subj, "gone", start.Add(-time.Minute))
	rec.during = func() {
		if err := b.src.Delete(context.Background(), subj, st.Seq); err != nil {
			t.Error(err)
		}
	}
	job = b.job(subj)
	job.Since = start.Add(-time.Second)
	if res := b.d.work(context.Background(), job, time.Time{}); res.Kind != schedule.Failed {
		t.Fatalf("head removed during the read: %+v, want Failed (look again)", res)
	}
	if a := b.snd.attempts(); len(a) != 0 {
		t.Fatalf("attempts %+v, want none", a)
	}
}

// A cancel of the head marked during the read is honoured: the head is not sent. Cancels
// of other clients let go during the read, more than the sending guard remembers, do not
// keep the head from its attempt: the worker looks at the guard again after the read.
func TestCancelsDuringTheReadAreHonouredWithoutStarvingTheHead(t *testing.T) {
	t.Parallel()
	for _, own := range []bool{true, false} {
		rec := &memAttempts{n: 1}
		b := setup(t, Config{Attempts: rec})
		subj := laneOf(1, "ned")
		b.src.add(subj, "r1", start.Add(-time.Minute))
		rec.during = func() {
			if own {
				markNow(b.d.sending, subj, "r1") // its removal not landed yet
				return
			}
			other := laneOf(2, "other")
			for i := range 2 * maxLetGo {
				id := fmt.Sprint("o", i)
				markNow(b.d.sending, other, id)
				b.d.sending.unmark(other, id)
			}
		}
		job := b.job(subj)
		job.Since = start.Add(-time.Second)
		res := b.d.work(context.Background(), job, time.Time{})
		sent := b.snd.attempts()
		switch {
		case own && (res.Kind == schedule.Delivered || len(sent) != 0):
			t.Errorf("the head's own cancel during the read: %+v, sent %+v; want it not sent", res, sent)
		case !own && (res.Kind != schedule.Delivered || len(sent) != 1 || sent[0].attempt != 2):
			t.Errorf("other clients' cancels during the read: %+v, sent %+v; want attempt 2 delivered", res, sent)
		}
	}
}
