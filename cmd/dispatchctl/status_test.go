package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/queue"
)

// A partition whose lease was last renewed over half a TTL ago is named: its holder may
// have stopped sending there (issue 29: a partition held with a lapsed lease stalled
// its clients unseen). Leases renewed on time are not.
func TestStatusNamesLeasesNotRenewed(t *testing.T) {
	t.Parallel()
	now := time.Now()
	st := admin.Status{Leases: &queue.LeaseStatus{TTL: 30 * time.Second, Partitions: 4, Unowned: []int{},
		Instances: []queue.InstanceStatus{
			{ID: "a", Heartbeat: now, Leases: []queue.PartitionLease{{Partition: 0, Renewed: now}, {Partition: 1, Renewed: now.Add(-20 * time.Second)}}},
			{ID: "b", Heartbeat: now, Leases: []queue.PartitionLease{{Partition: 2, Renewed: now.Add(-5 * time.Second)}, {Partition: 3, Renewed: now}}},
		}}}
	var out bytes.Buffer
	printLeases(&out, st)
	got := out.String()
	if n := strings.Count(got, "not renewed"); n != 1 || !strings.Contains(got, "not renewed\t1: 1 ") {
		t.Fatalf("status names %d instances' leases as not renewed, want a's partition 1 only:\n%s", n, got)
	}
}

// An id is shown so that what it holds is seen: quoted and escaped when it holds a space,
// a control character, or an invisible format character ("ali\u200bce" printed raw looked
// like "alice", where a bidi control was escaped already).
func TestIDsAreShownAsTheyAre(t *testing.T) {
	for in, want := range map[string]string{
		"alice":       "alice",
		"日本":          "日本",
		"a b":         `"a b"`,
		"ali\u200bce": `"ali\u200bce"`,
		"ali\u202ece": `"ali\u202ece"`,
		"\ufeffalice": `"\ufeffalice"`,
		"a\x01":       `"a\x01"`,
		"":            "-",
	} {
		if got := quote(in); got != want {
			t.Errorf("quote(%q) = %s, want %s", in, got, want)
		}
	}
}
