package admin

import (
	"cmp"
	"fmt"
	"testing"
)

// The clients page's top-k: 100,000 entries, a page just under the cut-over to a full
// sort, in the worst order for keeping them.
func BenchmarkFirstN(b *testing.B) {
	es := make([]backlogEntry, 100_000)
	for i := range es {
		es[i] = backlogEntry{id: fmt.Sprintf("c%06d", i), backlog: uint64(i)}
	}
	byBacklog := func(a, b backlogEntry) int { return cmp.Or(cmp.Compare(b.backlog, a.backlog), cmp.Compare(a.id, b.id)) }
	for _, n := range []int{100, 12_000, 24_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				firstN(es, n, byBacklog)
			}
		})
	}
}
