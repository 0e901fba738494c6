package cli

import (
	"io"
	"strings"
	"testing"
)

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
	for env, bad := range map[string]string{"RESPONSE_HEADERS": "none,X-Id"} {
		if _, err := parse(map[string]string{env: bad}); err == nil || !strings.Contains(err.Error(), env) {
			t.Errorf("%s=%q: %v, want refused naming it", env, bad, err)
		}
	}
}
