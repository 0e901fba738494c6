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

// RESPONSE_MAX_BYTES and RESPONSE_HEADERS: the defaults keep 64 KiB and the Content-Type;
// a list is read by name; a value that is no header name, or a size past the limit, is
// refused naming the setting.
func TestResponseSettings(t *testing.T) {
	parse := func(env map[string]string) (*Dispatch, error) {
		s := NewSettings("test", func(k string) string { return env[k] }, io.Discard)
		d := DispatchSettings(s)
		return d, s.Parse(nil)
	}
	d, err := parse(nil)
	if err != nil || d.Raven.KeepBytes != 64<<10 || strings.Join(d.Raven.KeepHeaders, ",") != "Content-Type" {
		t.Fatalf("defaults: %d %v (%v)", d.Raven.KeepBytes, d.Raven.KeepHeaders, err)
	}
	d, err = parse(map[string]string{"RESPONSE_MAX_BYTES": "0", "RESPONSE_HEADERS": " Content-Type, X-Request-Id ,"})
	if err != nil || d.Raven.KeepBytes != 0 || strings.Join(d.Raven.KeepHeaders, ",") != "Content-Type,X-Request-Id" {
		t.Fatalf("set: %d %v (%v)", d.Raven.KeepBytes, d.Raven.KeepHeaders, err)
	}
	if d, err = parse(map[string]string{"RESPONSE_HEADERS": ""}); err != nil || len(d.Raven.KeepHeaders) != 1 {
		t.Fatalf("empty (unset): %v (%v), want the default", d.Raven.KeepHeaders, err)
	}
	if d, err = parse(map[string]string{"RESPONSE_HEADERS": "none"}); err != nil || len(d.Raven.KeepHeaders) != 0 {
		t.Fatalf("none: %v (%v), want no headers", d.Raven.KeepHeaders, err)
	}
	for env, bad := range map[string]string{"RESPONSE_HEADERS": "Content Type", "RESPONSE_MAX_BYTES": "262145"} {
		if _, err := parse(map[string]string{env: bad}); err == nil || !strings.Contains(err.Error(), env) {
			t.Errorf("%s=%q: %v, want refused naming it", env, bad, err)
		}
	}
}
