//go:build !race

package dispatchsim_test

const raceEnabled = false
