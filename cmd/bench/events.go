package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"
)

// benchEvents measures what writing requests' events costs the dispatcher at the most
// sends per second it reaches (backlogged.saturated, a raven that takes everything):
// events off and on in interleaved rounds, the best of each, in both durability modes.
// Then what keeping raven's answers costs at that rate, with raven answering 1 KiB to
// each. Two or three rounds of each keep the scenario around three minutes.
func benchEvents(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	rounds, roundFor := 2, 4*time.Second
	if s.quick {
		rounds, roundFor = 1, time.Second
	}
	var rows []row
	for _, syncAlways := range []bool{true, false} {
		mode := modeName(syncAlways)
		without, with, err := interleaved(rounds, func(on bool) (float64, error) {
			return backlogged{syncAlways: syncAlways, events: on, log: log}.saturated(ctx, roundFor)
		})
		if err != nil {
			return rows, err
		}
		mo, me := slices.Max(without), slices.Max(with)
		fmt.Fprintf(log, "bench: events (%s): %.0f sends/s with, %.0f without (rounds %.0f / %.0f)\n", mode, me, mo, with, without)
		rows = append(rows, row{
			figure:    fmt.Sprintf("events: most sends/s with events on (2000 clients, 10 ms interval, dispatcher-bound; %s)", mode),
			value:     fmt.Sprintf("%.0f/s", me),
			reference: fmt.Sprintf("%.0f/s with events off (best of %d interleaved rounds each)", mo, rounds),
			ratio:     fmt.Sprintf("%.3f", me/mo),
			target:    ">= 0.90",
			verdict:   verdict(me/mo >= 0.9),
		})
	}
	// Raven answering 1 KiB of JSON to each: kept with each outcome (the default keeps up
	// to 64 KiB) against none kept (RESPONSE_MAX_BYTES=0), events on in both; a round more
	// than above, the difference sought being smaller.
	for _, syncAlways := range []bool{true, false} {
		mode := modeName(syncAlways)
		none, kept, err := interleaved(rounds+1, func(keep bool) (float64, error) {
			return backlogged{syncAlways: syncAlways, events: true, answer: 1 << 10, keepNone: !keep}.saturated(ctx, roundFor)
		})
		if err != nil {
			return rows, err
		}
		mn, mk := slices.Max(none), slices.Max(kept)
		fmt.Fprintf(log, "bench: answers (%s): %.0f sends/s keeping 1 KiB answers, %.0f keeping none (rounds %.0f / %.0f)\n", mode, mk, mn, kept, none)
		rows = append(rows, row{
			figure:    fmt.Sprintf("answers: most sends/s keeping raven's 1 KiB answers (defaults; 2000 clients, 10 ms interval, events on; %s)", mode),
			value:     fmt.Sprintf("%.0f/s", mk),
			reference: fmt.Sprintf("%.0f/s keeping none, RESPONSE_MAX_BYTES=0 (best of %d interleaved rounds each)", mn, rounds+1),
			ratio:     fmt.Sprintf("%.3f", mk/mn),
			target:    ">= 0.95",
			verdict:   verdict(mk/mn >= 0.95),
		})
	}
	return rows, nil
}
