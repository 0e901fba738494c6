package admin

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestFirstNIsTheSortedPrefix(t *testing.T) {
	t.Parallel()
	byBacklog := func(a, b backlogEntry) int {
		return cmp.Or(cmp.Compare(b.backlog, a.backlog), cmp.Compare(a.id, b.id))
	}
	for _, size := range []int{0, 1, 7, 100, 5000, 20000} {
		es := make([]backlogEntry, size)
		for i := range es {
			es[i] = backlogEntry{id: fmt.Sprintf("c%05d", rand.IntN(size+1)), backlog: uint64(rand.IntN(5))}
		}
		if size == 20000 { // worst for keeping a sorted prefix: each one better than the last
			for i := range es {
				es[i] = backlogEntry{id: fmt.Sprintf("c%05d", i), backlog: uint64(i)}
			}
		}
		want := slices.Clone(es)
		slices.SortFunc(want, byBacklog)
		for _, n := range []int{0, 1, 3, 50, 100, max(0, size/4-1), size / 2, size, size + 10} {
			got := firstN(es, n, byBacklog)
			if !slices.Equal(got, want[:min(n, size)]) {
				t.Fatalf("%d entries, first %d: %v, want %v", size, n, got, want[:min(n, size)])
			}
		}
	}
}
