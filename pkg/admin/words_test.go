package admin_test

import (
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/governor"
)

// Ages read as a person reads them: tenths below 10 s, whole seconds below an hour,
// whole minutes above; and they stay Go durations.
func TestAgeRoundsAsAPersonReads(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0: "0s", 30 * time.Millisecond: "0s", -30 * time.Millisecond: "0s", 240 * time.Millisecond: "200ms",
		3240 * time.Millisecond: "3.2s", 9960 * time.Millisecond: "10s", 59294 * time.Millisecond: "59s",
		60975 * time.Millisecond: "1m1s", 59*time.Minute + 59600*time.Millisecond: "1h", -90 * time.Second: "-1m30s",
		2*time.Hour + 5*time.Minute + 10*time.Second: "2h5m", 26 * time.Hour: "26h",
	} {
		got := admin.Age(d)
		if got != want {
			t.Errorf("Age(%s) = %q, want %q", d, got, want)
		}
		if _, err := time.ParseDuration(got); err != nil {
			t.Errorf("Age(%s) = %q is not a Go duration: %v", d, got, err)
		}
	}
}

func TestCountSaysOneInTheSingular(t *testing.T) {
	t.Parallel()
	for n, want := range map[int]string{0: "0 attempts", 1: "1 attempt", 2: "2 attempts"} {
		if got := admin.Count(n, "attempt", "attempts"); got != want {
			t.Errorf("Count(%d) = %q, want %q", n, got, want)
		}
	}
}

// An instance that owns partitions with an effective rate of 0 is not limited; one that
// owns none sends nothing, whatever its budget. The instances together are unlimited
// when one of them is.
func TestRateUnlimited(t *testing.T) {
	t.Parallel()
	free := admin.InstanceBudget{Instance: "a", BudgetState: governor.BudgetState{Owned: 2, Partitions: 4}}
	held := admin.InstanceBudget{Instance: "b", BudgetState: governor.BudgetState{MaxRate: 10, Owned: 2, Partitions: 4, ShareRate: 5, EffectiveRate: 5}}
	idle := admin.InstanceBudget{Instance: "c", BudgetState: governor.BudgetState{Partitions: 4}}
	if !free.RateUnlimited() || held.RateUnlimited() || idle.RateUnlimited() {
		t.Fatalf("unlimited: free %v, held %v, idle %v; want true, false, false", free.RateUnlimited(), held.RateUnlimited(), idle.RateUnlimited())
	}
	if v := (admin.BudgetView{Instances: []admin.InstanceBudget{held, free}}); !v.RateUnlimited() {
		t.Fatal("one instance unlimited: the sum is not said to be unlimited")
	}
	if v := (admin.BudgetView{Instances: []admin.InstanceBudget{held, idle}}); v.RateUnlimited() {
		t.Fatal("no instance unlimited: the sum is said to be unlimited")
	}
}
