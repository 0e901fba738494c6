package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/penguinhq/dispatcher/pkg/lease"
	"github.com/penguinhq/dispatcher/pkg/raven"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// Unit tests of the attempt's branches (work), one head request at a time, against the
// in-memory source and the test's clock.

func TestWorkDeliversAndRemoves(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	subj := laneOf(1, "alice")
	b.src.add(subj, "r1", start)
	b.src.add(subj, "r2", start)
	res := b.d.work(context.Background(), b.job(subj), time.Time{})
	if res.Kind != schedule.Delivered || res.AttemptEnd != start {
		t.Fatalf("result %+v, want Delivered ending at the clock's time", res)
	}
	if got := b.src.ids(); !slices.Equal(got, []string{"r2"}) {
		t.Fatalf("queued after delivery: %v, want [r2]", got)
	}
	if a := b.snd.attempts(); len(a) != 1 || a[0].id != "r1" || a[0].attempt != 1 {
		t.Fatalf("attempts %+v, want r1 once as attempt 1", a)
	}
	if d, ok := b.d.Delivered("r1"); !ok || d.Attempt != 1 {
		t.Fatalf("Delivered(r1) = %+v, %v: want it remembered", d, ok)
	}
}

func TestWorkEmptyClient(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	if res := b.d.work(context.Background(), b.job(laneOf(0, "nobody")), time.Time{}); res.Kind != schedule.Empty {
		t.Fatalf("result %+v, want Empty", res)
	}
	if len(b.snd.attempts()) != 0 {
		t.Fatal("something was sent for a client with nothing queued")
	}
}

// An operator's purge dead-letters the requests up to its mark unsent, one per job,
// and leaves later ones; it is not done while the lease could lapse.
func TestWorkPurgesUpToTheMark(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	subj := laneOf(2, "bob")
	b.src.add(subj, "old", start)
	mark := b.src.add(subj, "older", start).Seq
	b.src.add(subj, "new", start)
	job := b.job(subj)
	job.PurgeThrough = mark

	// The lease could lapse now: hold, touch nothing.
	if res := b.d.work(context.Background(), job, start); res.Kind != schedule.Held {
		t.Fatalf("purge with the lease lapsing: %+v, want Held", res)
	}
	if len(b.src.deadLetters()) != 0 || len(b.src.ids()) != 3 {
		t.Fatal("a purge went ahead while the partition's lease could have lapsed")
	}

	for range 2 {
		if res := b.d.work(context.Background(), job, time.Time{}); res.Kind != schedule.DeadLettered || !res.AttemptEnd.IsZero() {
			t.Fatalf("purge: %+v, want DeadLettered with no attempt made", res)
		}
	}
	if res := b.d.work(context.Background(), job, time.Time{}); res.Kind != schedule.Delivered {
		t.Fatalf("after the mark: %+v, want the later request delivered", res)
	}
	if got := sortedIDs(b.src.deadLetters()); !slices.Equal(got, []string{"old:purged", "older:purged"}) {
		t.Fatalf("dead letters %v, want old and older purged", got)
	}
	if a := b.snd.attempts(); len(a) != 1 || a[0].id != "new" {
		t.Fatalf("attempts %+v, want only the request after the mark sent", a)
	}
}

func TestWorkPausedClientParks(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	subj := laneOf(0, "carol")
	b.src.add(subj, "r1", start)
	job := b.job(subj)
	job.Paused = true
	if res := b.d.work(context.Background(), job, time.Time{}); res.Kind != schedule.Parked {
		t.Fatalf("result %+v, want Parked", res)
	}
	if len(b.snd.attempts()) != 0 || len(b.src.ids()) != 1 {
		t.Fatal("a paused client's request was sent or removed")
	}
}

func TestWorkUndecodableHeadIsDeadLetteredUnsent(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	subj := laneOf(3, "dave")
	raw := b.src.add(subj, "raw", start)
	b.src.undecodable[raw.Seq] = true
	b.src.add(subj, "good", start)
	if res := b.d.work(context.Background(), b.job(subj), time.Time{}); res.Kind != schedule.DeadLettered {
		t.Fatalf("result %+v, want DeadLettered", res)
	}
	if got := sortedIDs(b.src.deadLetters()); !slices.Equal(got, []string{"raw:undecodable"}) {
		t.Fatalf("dead letters %v, want raw as undecodable", got)
	}
	if len(b.snd.attempts()) != 0 || !slices.Equal(b.src.ids(), []string{"good"}) {
		t.Fatal("the undecodable request was sent, or the next one touched")
	}
}

func TestWorkQueueUnreadableFails(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.src.headErr = errors.New("no responders")
	if res := b.d.work(context.Background(), b.job(laneOf(0, "erin")), time.Time{}); res.Kind != schedule.Failed {
		t.Fatalf("result %+v, want Failed", res)
	}
}

// A lane whose lease may lapse before the attempt could start is held: nothing is sent.
func TestWorkHeldWhenTheLeaseMayLapse(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	subj := laneOf(1, "frank")
	b.src.add(subj, "r1", start)
	if res := b.d.work(context.Background(), b.job(subj), start); res.Kind != schedule.Held {
		t.Fatalf("sendBy = now: %+v, want Held", res)
	}
	if res := b.d.work(context.Background(), b.job(subj), start.Add(-time.Second)); res.Kind != schedule.Held {
		t.Fatalf("sendBy passed: %+v, want Held", res)
	}
	if len(b.snd.attempts()) != 0 {
		t.Fatal("an attempt started after the lease could have lapsed")
	}
	if res := b.d.work(context.Background(), b.job(subj), start.Add(time.Nanosecond)); res.Kind != schedule.Delivered {
		t.Fatalf("sendBy still ahead: %+v, want Delivered", res)
	}
}

// Raven took so long that the lease could have lapsed before the removal landed: the
// removal is reported with the request's id, as a duplicate is then possible.
func TestWorkReportsARemovalAfterTheLeaseCouldLapse(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{LeaseTTL: 30 * time.Second, SendTimeout: 2 * time.Second})
	subj := laneOf(0, "gina")
	b.src.add(subj, "slow", start)
	b.snd.answer = func(request.Stored, int) error {
		b.clock.advance(time.Minute) // paused, or raven slow past the lease
		return nil
	}
	sendBy := start.Add(10 * time.Second)
	if res := b.d.work(context.Background(), b.job(subj), sendBy); res.Kind != schedule.Delivered {
		t.Fatalf("result %+v, want Delivered", res)
	}
	if !strings.Contains(b.log.String(), LogRemovalLate) || !strings.Contains(b.log.String(), `"request_id":"slow"`) {
		t.Fatalf("log lacks the late removal of request slow:\n%s", b.log)
	}
}

// A delivered request already gone when its removal comes, within the lease, was removed
// before this attempt: raven may have had it twice, and the log says so with its id. A
// removal whose first answer was lost finds it gone on its retry, and says nothing of the
// kind; nor does one gone when the lease could have lapsed (the next owner's removal).
func TestWorkReportsADeliveredRequestRemovedBefore(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{})
		subj := laneOf(1, "gus")
		st := b.src.add(subj, "twice", start)
		b.snd.answer = func(request.Stored, int) error {
			if err := b.src.Delete(context.Background(), subj, st.Seq); err != nil {
				t.Errorf("removing it meanwhile, as another removal would: %v", err)
			}
			return nil
		}
		if res := b.d.work(context.Background(), b.job(subj), time.Time{}); res.Kind != schedule.Delivered {
			t.Fatalf("result %+v, want Delivered", res)
		}
		if !strings.Contains(b.log.String(), LogRemovedBefore) || !strings.Contains(b.log.String(), `"request_id":"twice"`) {
			t.Fatalf("log lacks the request removed before its removal:\n%s", b.log)
		}

		lost := setup(t, Config{})
		subj = laneOf(2, "hal")
		lost.src.add(subj, "once", start)
		lost.src.deleteAnswersLost = 1
		if res := lost.d.work(context.Background(), lost.job(subj), time.Time{}); res.Kind != schedule.Delivered {
			t.Fatalf("result %+v, want Delivered once the retry found it gone", res)
		}
		if lost.src.deletes != 2 || len(lost.src.ids()) != 0 {
			t.Fatalf("%d deletes, queued %v; want 2 and none", lost.src.deletes, lost.src.ids())
		}
		if strings.Contains(lost.log.String(), LogRemovedBefore) || !strings.Contains(lost.log.String(), LogRemovalFailed) {
			t.Fatalf("a lost answer to a removal is logged as a failed removal only:\n%s", lost.log)
		}

		late := setup(t, Config{LeaseTTL: 30 * time.Second, SendTimeout: 2 * time.Second})
		subj = laneOf(3, "ida")
		st = late.src.add(subj, "slow", start)
		late.snd.answer = func(request.Stored, int) error {
			late.clock.advance(time.Minute)                         // paused past the lease
			_ = late.src.Delete(context.Background(), subj, st.Seq) // and the next owner sent and removed it
			return nil
		}
		if res := late.d.work(context.Background(), late.job(subj), start.Add(10*time.Second)); res.Kind != schedule.Delivered {
			t.Fatalf("result %+v, want Delivered", res)
		}
		if strings.Contains(late.log.String(), LogRemovedBefore) || !strings.Contains(late.log.String(), LogRemovalLate) {
			t.Fatalf("a request gone after the lease could lapse is logged as a late removal only:\n%s", late.log)
		}
	})
}

// A removal that fails is retried until it lands, and reported with the request's id.
// (In a synctest bubble: the pauses between the retries take no time.)
func TestWorkRetriesAFailedRemoval(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{})
		subj := laneOf(2, "hank")
		b.src.add(subj, "r1", start)
		b.src.deleteFails = 2
		if res := b.d.work(context.Background(), b.job(subj), time.Time{}); res.Kind != schedule.Delivered {
			t.Fatalf("result %+v, want Delivered once the removal landed", res)
		}
		if len(b.src.ids()) != 0 || b.src.deletes != 3 {
			t.Fatalf("queued %v after %d deletes, want empty after 3", b.src.ids(), b.src.deletes)
		}
		if !strings.Contains(b.log.String(), LogRemovalFailed) {
			t.Fatalf("log lacks the failed removal:\n%s", b.log)
		}
	})
}

// Shutdown while a removal keeps failing: the request stays, and the lane reports
// Failed, not Delivered. (In a synctest bubble, as the retries pause.)
func TestWorkRemovalCutShortByShutdown(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{})
		subj := laneOf(2, "ivy")
		b.src.add(subj, "r1", start)
		b.src.deleteFails = 1 << 30
		ctx, cancel := context.WithCancel(context.Background())
		b.snd.answer = func(request.Stored, int) error { cancel(); return nil }
		if res := b.d.work(ctx, b.job(subj), time.Time{}); res.Kind != schedule.Failed {
			t.Fatalf("result %+v, want Failed", res)
		}
		if !slices.Equal(b.src.ids(), []string{"r1"}) {
			t.Fatalf("queued %v, want r1 kept for a later send", b.src.ids())
		}
		if _, ok := b.d.Delivered("r1"); ok {
			t.Fatal("a request left in the queue is remembered as delivered")
		}
	})
}

func TestWorkTransientFailureRetriesThenGivesUp(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Policy: schedule.Policy{MaxAttempts: 3}})
	subj := laneOf(1, "jack")
	st := b.src.add(subj, "r1", start)
	b.snd.answer = func(request.Stored, int) error { return &request.TransientError{Status: 429, After: 7 * time.Second} }
	job := b.job(subj)
	for attempt := 1; attempt <= 2; attempt++ {
		res := b.d.work(context.Background(), job, time.Time{})
		if res.Kind != schedule.Retry || res.Seq != st.Seq || res.Attempts != attempt || res.RetryAfter != 7*time.Second || res.FirstAttempt != start {
			t.Fatalf("attempt %d: %+v, want Retry of seq %d as attempt %d with Retry-After 7s", attempt, res, st.Seq, attempt)
		}
		job.HeadSeq, job.Attempts, job.FirstAttempt = res.Seq, res.Attempts, res.FirstAttempt
		b.clock.advance(time.Second)
	}
	if res := b.d.work(context.Background(), job, time.Time{}); res.Kind != schedule.DeadLettered {
		t.Fatalf("third attempt: %+v, want DeadLettered", res)
	}
	dead := b.src.deadLetters()
	if len(dead) != 1 || dead[0].why.Reason != request.ReasonAttemptsExhausted || dead[0].why.Attempts != 3 ||
		dead[0].why.LastStatus != 429 || dead[0].why.FirstAttempt != start || dead[0].why.LastAttempt != start.Add(2*time.Second) {
		t.Fatalf("dead letter %+v, want attempts_exhausted after 3, last status 429, first and last attempt times kept", dead)
	}
	if a := b.snd.attempts(); len(a) != 3 || a[2].attempt != 3 {
		t.Fatalf("attempts %+v, want 3 numbered 1 to 3", a)
	}
}

func TestWorkPermanentFailureIsDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	subj := laneOf(3, "kim")
	b.src.add(subj, "bad", start)
	b.snd.answer = func(request.Stored, int) error { return &request.PermanentError{Status: 422} }
	if res := b.d.work(context.Background(), b.job(subj), time.Time{}); res.Kind != schedule.DeadLettered {
		t.Fatalf("result %+v, want DeadLettered", res)
	}
	dead := b.src.deadLetters()
	if len(dead) != 1 || dead[0].why.Reason != request.ReasonPermanent || dead[0].why.LastStatus != 422 || dead[0].why.LastError != "" {
		t.Fatalf("dead letter %+v, want permanent 422 with no error text (raven answered)", dead)
	}
	if len(b.src.ids()) != 0 {
		t.Fatal("the dead-lettered request is still queued")
	}
}

// A new head (the one a retry was counting for is gone) starts at attempt 1 again.
func TestWorkCountsAttemptsPerRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	subj := laneOf(0, "lee")
	b.src.add(subj, "r1", start)
	job := b.job(subj)
	job.HeadSeq, job.Attempts, job.FirstAttempt = 99, 4, start.Add(-time.Hour)
	b.d.work(context.Background(), job, time.Time{})
	if a := b.snd.attempts(); len(a) != 1 || a[0].attempt != 1 {
		t.Fatalf("attempts %+v, want attempt 1 for a request not seen before", a)
	}
}

// MaxAge bounds how long a request is retried once it could go, not how long it waited
// behind its client's earlier requests: a request queued behind a head delayed past
// MaxAge is not dead-lettered as age_exhausted on its first transient failure; it is
// retried and delivered. (Its age starts at its first attempt.)
func TestMaxAgeCountsFromTheFirstAttempt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{Policy: schedule.Policy{Interval: time.Second, MaxAge: time.Hour}})
		l := newTestLoop(t, b)
		ownAll(b, l)
		subj := laneOf(0, "a")
		b.src.add(subj, "delayed", start)
		b.src.add(subj, "behind", start)
		b.src.mu.Lock()
		b.src.queued[0].NotBefore = start.Add(2 * time.Hour)
		b.src.mu.Unlock()
		l.notify(subj)
		failed := false
		b.snd.answer = func(st request.Stored, _ int) error {
			if st.ID == "behind" && !failed {
				failed = true
				return raven.Classify(503, "", b.clock.now())
			}
			return nil
		}
		drive(t, b, l, 5*time.Second, 10*time.Millisecond)
		b.clock.advance(2 * time.Hour)
		for p := range b.src.Partitions() { // the leases were renewed meanwhile
			l.ownership(lease.Event{Kind: lease.Renewed, Partition: p, ValidUntil: b.clock.now().Add(time.Hour)})
		}
		drive(t, b, l, time.Minute, 10*time.Millisecond)
		if d := b.src.deadLetters(); len(d) != 0 {
			t.Fatalf("dead-lettered %v, want none: the request waited behind a delayed head, it did not age", sortedIDs(d))
		}
		var got []string
		for _, a := range b.snd.attempts() {
			got = append(got, fmt.Sprintf("%s#%d", a.id, a.attempt))
		}
		if want := []string{"delayed#1", "behind#1", "behind#2"}; !slices.Equal(got, want) {
			t.Fatalf("attempts %v, want %v", got, want)
		}
		if q := b.src.ids(); len(q) != 0 {
			t.Fatalf("still queued: %v", q)
		}
	})
}

// And MaxAge still ends the retries: a request that fails from its first attempt on is
// dead-lettered as age_exhausted at its first failure at least MaxAge after that attempt.
func TestMaxAgeEndsTheRetries(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{Policy: schedule.Policy{Interval: time.Second, MaxAge: time.Hour, MaxAttempts: 1000}})
		l := newTestLoop(t, b)
		ownAll(b, l)
		queue(b, l, []string{"a"}, 1)
		b.snd.answer = func(request.Stored, int) error { return raven.Classify(503, "", b.clock.now()) }
		drive(t, b, l, 50*time.Minute, time.Second)
		for p := range b.src.Partitions() {
			l.ownership(lease.Event{Kind: lease.Renewed, Partition: p, ValidUntil: b.clock.now().Add(time.Hour)})
		}
		drive(t, b, l, 20*time.Minute, time.Second)
		a, d := b.snd.attempts(), b.src.deadLetters()
		if len(d) != 1 || d[0].why.Reason != request.ReasonAgeExhausted {
			t.Fatalf("dead letters %v after %d attempts over 70 min, want the request, age_exhausted", sortedIDs(d), len(a))
		}
		if len(a) < 2 {
			t.Fatalf("%d attempts, want retries", len(a))
		}
		if last := a[len(a)-1].at; last.Sub(a[0].at) < time.Hour || a[len(a)-2].at.Sub(a[0].at) >= time.Hour {
			t.Fatalf("last attempt %s after the first, the one before it %s: want the first one past MaxAge (1h) to end it",
				last.Sub(a[0].at), a[len(a)-2].at.Sub(a[0].at))
		}
	})
}
