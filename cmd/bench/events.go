package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// benchEvents measures what writing requests' events costs the dispatcher at the most
// sends per second it reaches (backlogged.saturated, a raven that takes everything):
// events off and on in interleaved rounds, the best of each, in both durability modes.
// Then what keeping raven's answers costs at that rate, with raven answering 1 KiB to
// each. Two or three rounds of each keep the scenario around three minutes.
func benchEvents(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	// The answers' comparison takes a round more, the difference sought being smaller.
	rounds, answerRounds, roundFor := 2, 3, 4*time.Second
	if s.quick {
		rounds, answerRounds, roundFor = 1, 1, time.Second
	}
	var rows []row
	// Each side's best of interleaved rounds, in both durability modes.
	compare := func(name, onWord, offWord string, rounds int, target float64, run func(syncAlways, on bool) (float64, error)) error {
		for _, syncAlways := range []bool{true, false} {
			mode := modeName(syncAlways)
			off, on, err := interleaved(rounds, func(on bool) (float64, error) { return run(syncAlways, on) })
			if err != nil {
				return err
			}
			mo, me := slices.Max(off), slices.Max(on)
			fmt.Fprintf(log, "bench: %s (%s): %.0f sends/s %s, %.0f %s (rounds %.0f / %.0f)\n", strings.TrimSuffix(strings.Fields(name)[0], ":"), mode, me, onWord, mo, offWord, on, off)
			rows = append(rows, row{
				figure:    fmt.Sprintf("%s; %s)", name, mode),
				value:     fmt.Sprintf("%.0f/s", me),
				reference: fmt.Sprintf("%.0f/s %s (best of %d interleaved rounds each)", mo, offWord, rounds),
				ratio:     fmt.Sprintf("%.3f", me/mo),
				target:    fmt.Sprintf(">= %.2f", target),
				verdict:   verdict(me/mo >= target),
			})
		}
		return nil
	}
	err := compare("events: most sends/s with events on (2000 clients, 10 ms interval, dispatcher-bound", "with events on", "with events off", rounds, 0.9,
		func(syncAlways, on bool) (float64, error) {
			return backlogged{syncAlways: syncAlways, events: on, log: log}.saturated(ctx, roundFor)
		})
	if err != nil {
		return rows, err
	}
	// Raven answering 1 KiB of JSON to each: kept with each outcome (the default keeps up
	// to 64 KiB) against none kept (RESPONSE_MAX_BYTES=0), events on in both.
	err = compare("answers: most sends/s keeping raven's 1 KiB answers (defaults; 2000 clients, 10 ms interval, events on", "keeping 1 KiB answers", "keeping none, RESPONSE_MAX_BYTES=0", answerRounds, 0.95,
		func(syncAlways, keep bool) (float64, error) {
			return backlogged{syncAlways: syncAlways, events: true, answer: 1 << 10, keepNone: !keep}.saturated(ctx, roundFor)
		})
	return rows, err
}
