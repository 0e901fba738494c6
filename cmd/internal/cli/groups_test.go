package cli

import (
	"io"
	"strings"
	"testing"
)

// The defaults agree with each other: a default start says nothing of MAX_NOT_BEFORE and
// STATUS_RETENTION, while settings that disagree are warned about, naming both.
func TestNotBeforeWarning(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		want []string // substrings of the warning; nil for none
	}{
		{"Defaults", nil, nil},
		{"EventsOff", map[string]string{"EVENTS": "false", "MAX_NOT_BEFORE": "168h"}, nil},
		{"LongerNotBefore", map[string]string{"MAX_NOT_BEFORE": "168h"}, []string{"MAX_NOT_BEFORE=168h0m0s", "STATUS_RETENTION=24h0m0s"}},
		{"ShorterRetention", map[string]string{"STATUS_RETENTION": "12h"}, []string{"MAX_NOT_BEFORE=24h0m0s", "STATUS_RETENTION=12h0m0s"}},
		{"LongerRetention", map[string]string{"MAX_NOT_BEFORE": "168h", "STATUS_RETENTION": "168h"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := NewSettings("test", func(k string) string { return c.env[k] }, io.Discard)
			q, in := QueueSettings(s), IngestSettings(s)
			var events bool
			EventsSetting(s, &events)
			if err := s.Parse(nil); err != nil {
				t.Fatal(err)
			}
			w := NotBeforeWarning(*q, in.MaxNotBefore, events)
			if c.want == nil && w != "" {
				t.Fatalf("warned %q, want nothing", w)
			}
			for _, sub := range c.want {
				if !strings.Contains(w, sub) {
					t.Fatalf("warned %q, want it to name %s", w, sub)
				}
			}
		})
	}
}
