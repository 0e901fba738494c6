package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/ledger"
)

// A duplicate is the kill's only when the request was sent again after the kill, by
// another dispatcher: one sent again before it, or by the killed one, is not.
func TestResentAfterIsTheKillsCause(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 4, 21, 0, 0, 0, time.UTC)
	k := kill{id: "d0-1", at: at}
	by := func(id, who string, start time.Time) ledger.Arrival {
		return ledger.Arrival{ID: id, Start: start, Header: http.Header{"User-Agent": {"dispatcher/" + who}}}
	}
	cases := []struct {
		name  string
		later []ledger.Arrival
		want  bool
	}{
		{"sent again after the kill by another", []ledger.Arrival{by("x", "d1-1", at.Add(4*time.Second))}, true},
		{"sent again before the kill", []ledger.Arrival{by("x", "d1-1", at.Add(-time.Second))}, false},
		{"sent again by the killed one", []ledger.Arrival{by("x", "d0-1", at.Add(time.Second))}, false},
		{"only another request after the kill", []ledger.Arrival{by("y", "d1-1", at.Add(time.Second))}, false},
		{"the next send of it decides", []ledger.Arrival{by("x", "d1-1", at.Add(-time.Second)), by("x", "d2-1", at.Add(time.Second))}, false},
	}
	for _, c := range cases {
		if got := resentAfter(c.later, "x", k); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
