package dispatch

import (
	"fmt"
	"testing"

	"github.com/penguinhq/dispatcher/pkg/introspect"
)

func TestRecentDeliveriesForgetTheOldest(t *testing.T) {
	t.Parallel()
	r := newRecent(3)
	for i := range 5 {
		r.add(introspect.Delivery{ID: fmt.Sprint("id-", i), Attempt: i})
	}
	for i := range 5 {
		d, ok := r.get(fmt.Sprint("id-", i))
		if want := i >= 2; ok != want || (ok && d.Attempt != i) {
			t.Fatalf("id-%d: %+v, %v; want remembered = %v", i, d, ok, want)
		}
	}
	// The same id delivered twice (a resend) is remembered at its latest, and evicting
	// the older copy does not forget it.
	r.add(introspect.Delivery{ID: "id-4", Attempt: 9})
	r.add(introspect.Delivery{ID: "x"})
	r.add(introspect.Delivery{ID: "y"})
	if d, ok := r.get("id-4"); !ok || d.Attempt != 9 {
		t.Fatalf("id-4 after a resend: %+v, %v", d, ok)
	}
	if newRecent(0) != nil || newRecent(-1) != nil {
		t.Fatal("a ring of no size should remember nothing")
	}
	var none *recent
	none.add(introspect.Delivery{ID: "z"})
	if _, ok := none.get("z"); ok {
		t.Fatal("a nil ring remembered something")
	}
}
