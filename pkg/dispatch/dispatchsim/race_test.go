//go:build race

package dispatchsim_test

// Under the race detector a schedule takes several times as long: CI runs a sample of
// the schedules there (for data races in the real code under faults) and the full
// default budget in a run of its own without it.
const raceEnabled = true
