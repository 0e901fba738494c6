package dispatch

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Unit tests of the attempt's branches (work), one head request at a time, against the
// in-memory source and the test's clock.

type permanentErr struct{ status int }

func (e permanentErr) Error() string   { return "rejected" }
func (e permanentErr) Permanent() bool { return true }
func (e permanentErr) StatusCode() int { return e.status }

type retryAfterErr struct{ after time.Duration }

func (e retryAfterErr) Error() string             { return "busy" }
func (e retryAfterErr) RetryAfter() time.Duration { return e.after }
func (e retryAfterErr) StatusCode() int           { return 429 }

func TestWorkDeliversAndRemoves(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	subj := subject(1, "alice")
	b.src.add(subj, "r1", start)
	b.src.add(subj, "r2", start)
	res := b.d.work(context.Background(), b.job(subj), time.Time{})
	if res.Kind != Delivered || res.AttemptEnd != start {
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
	if res := b.d.work(context.Background(), b.job(subject(0, "nobody")), time.Time{}); res.Kind != Empty {
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
	subj := subject(2, "bob")
	b.src.add(subj, "old", start)
	mark := b.src.add(subj, "older", start).Seq
	b.src.add(subj, "new", start)
	job := b.job(subj)
	job.PurgeThrough = mark

	// The lease could lapse now: hold, touch nothing.
	if res := b.d.work(context.Background(), job, start); res.Kind != Held {
		t.Fatalf("purge with the lease lapsing: %+v, want Held", res)
	}
	if len(b.src.deadLetters()) != 0 || len(b.src.ids()) != 3 {
		t.Fatal("a purge went ahead while the partition's lease could have lapsed")
	}

	for range 2 {
		if res := b.d.work(context.Background(), job, time.Time{}); res.Kind != DeadLettered || !res.AttemptEnd.IsZero() {
			t.Fatalf("purge: %+v, want DeadLettered with no attempt made", res)
		}
	}
	if res := b.d.work(context.Background(), job, time.Time{}); res.Kind != Delivered {
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
	subj := subject(0, "carol")
	b.src.add(subj, "r1", start)
	job := b.job(subj)
	job.Paused = true
	if res := b.d.work(context.Background(), job, time.Time{}); res.Kind != Parked {
		t.Fatalf("result %+v, want Parked", res)
	}
	if len(b.snd.attempts()) != 0 || len(b.src.ids()) != 1 {
		t.Fatal("a paused client's request was sent or removed")
	}
}

func TestWorkUndecodableHeadIsDeadLetteredUnsent(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	subj := subject(3, "dave")
	raw := b.src.add(subj, "raw", start)
	b.src.undecodable[raw.Seq] = true
	b.src.add(subj, "good", start)
	if res := b.d.work(context.Background(), b.job(subj), time.Time{}); res.Kind != DeadLettered {
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
	if res := b.d.work(context.Background(), b.job(subject(0, "erin")), time.Time{}); res.Kind != Failed {
		t.Fatalf("result %+v, want Failed", res)
	}
}

// A lane whose lease may lapse before the attempt could start is held: nothing is sent.
func TestWorkHeldWhenTheLeaseMayLapse(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	subj := subject(1, "frank")
	b.src.add(subj, "r1", start)
	if res := b.d.work(context.Background(), b.job(subj), start); res.Kind != Held {
		t.Fatalf("sendBy = now: %+v, want Held", res)
	}
	if res := b.d.work(context.Background(), b.job(subj), start.Add(-time.Second)); res.Kind != Held {
		t.Fatalf("sendBy passed: %+v, want Held", res)
	}
	if len(b.snd.attempts()) != 0 {
		t.Fatal("an attempt started after the lease could have lapsed")
	}
	if res := b.d.work(context.Background(), b.job(subj), start.Add(time.Nanosecond)); res.Kind != Delivered {
		t.Fatalf("sendBy still ahead: %+v, want Delivered", res)
	}
}

// Raven took so long that the lease could have lapsed before the removal landed: the
// removal is reported with the request's id, as a duplicate is then possible.
func TestWorkReportsARemovalAfterTheLeaseCouldLapse(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{LeaseTTL: 30 * time.Second, SendTimeout: 2 * time.Second})
	subj := subject(0, "gina")
	b.src.add(subj, "slow", start)
	b.snd.answer = func(request.Stored, int) error {
		b.clock.advance(time.Minute) // paused, or raven slow past the lease
		return nil
	}
	sendBy := start.Add(10 * time.Second)
	if res := b.d.work(context.Background(), b.job(subj), sendBy); res.Kind != Delivered {
		t.Fatalf("result %+v, want Delivered", res)
	}
	if !strings.Contains(b.log.String(), LogRemovalLate) || !strings.Contains(b.log.String(), `"request_id":"slow"`) {
		t.Fatalf("log lacks the late removal of request slow:\n%s", b.log)
	}
}

// A removal that fails is retried until it lands, and reported with the request's id.
// (In a synctest bubble: the pauses between the retries take no time.)
func TestWorkRetriesAFailedRemoval(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{})
		subj := subject(2, "hank")
		b.src.add(subj, "r1", start)
		b.src.deleteFails = 2
		if res := b.d.work(context.Background(), b.job(subj), time.Time{}); res.Kind != Delivered {
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
		subj := subject(2, "ivy")
		b.src.add(subj, "r1", start)
		b.src.deleteFails = 1 << 30
		ctx, cancel := context.WithCancel(context.Background())
		b.snd.answer = func(request.Stored, int) error { cancel(); return nil }
		if res := b.d.work(ctx, b.job(subj), time.Time{}); res.Kind != Failed {
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
	b := setup(t, Config{Policy: Policy{MaxAttempts: 3}})
	subj := subject(1, "jack")
	st := b.src.add(subj, "r1", start)
	b.snd.answer = func(request.Stored, int) error { return retryAfterErr{after: 7 * time.Second} }
	job := b.job(subj)
	for attempt := 1; attempt <= 2; attempt++ {
		res := b.d.work(context.Background(), job, time.Time{})
		if res.Kind != Retry || res.Seq != st.Seq || res.Attempts != attempt || res.RetryAfter != 7*time.Second || res.FirstAttempt != start {
			t.Fatalf("attempt %d: %+v, want Retry of seq %d as attempt %d with Retry-After 7s", attempt, res, st.Seq, attempt)
		}
		job.HeadSeq, job.Attempts, job.FirstAttempt = res.Seq, res.Attempts, res.FirstAttempt
		b.clock.advance(time.Second)
	}
	if res := b.d.work(context.Background(), job, time.Time{}); res.Kind != DeadLettered {
		t.Fatalf("third attempt: %+v, want DeadLettered", res)
	}
	dead := b.src.deadLetters()
	if len(dead) != 1 || dead[0].why.Reason != request.ReasonAttemptsExhausted || dead[0].why.Attempts != 3 ||
		dead[0].why.LastStatus != 429 || dead[0].why.FirstAttempt != start || dead[0].why.LastAttempt != start.Add(2*time.Second) {
		t.Fatalf("dead letter %+v, want attempts-exhausted after 3, last status 429, first and last attempt times kept", dead)
	}
	if a := b.snd.attempts(); len(a) != 3 || a[2].attempt != 3 {
		t.Fatalf("attempts %+v, want 3 numbered 1 to 3", a)
	}
}

func TestWorkPermanentFailureIsDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	subj := subject(3, "kim")
	b.src.add(subj, "bad", start)
	b.snd.answer = func(request.Stored, int) error { return permanentErr{status: 422} }
	if res := b.d.work(context.Background(), b.job(subj), time.Time{}); res.Kind != DeadLettered {
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
	subj := subject(0, "lee")
	b.src.add(subj, "r1", start)
	job := b.job(subj)
	job.HeadSeq, job.Attempts, job.FirstAttempt = 99, 4, start.Add(-time.Hour)
	b.d.work(context.Background(), job, time.Time{})
	if a := b.snd.attempts(); len(a) != 1 || a[0].attempt != 1 {
		t.Fatalf("attempts %+v, want attempt 1 for a request not seen before", a)
	}
}
