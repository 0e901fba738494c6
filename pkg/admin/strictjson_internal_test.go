package admin

import (
	"strings"
	"testing"
)

// A strict decode refuses what encoding/json would take without a word: invalid UTF-8,
// and two keys of one object that name the same field but for case (the last won: an
// admin purge of {"client":"nobody","CLIENT":"kim"} purged kim). Keys alike in different
// objects, and the same key at different depths, are fine.
func TestDecodeStrictRefusesAmbiguousKeys(t *testing.T) {
	type body struct {
		Client string         `json:"client"`
		Nested map[string]any `json:"nested"`
		List   []any          `json:"list"`
	}
	for in, want := range map[string]string{
		`{"client":"a","CLIENT":"b"}`:           "the same field",
		`{"client":"a","client":"b"}`:           "the same field",
		`{"client":"a","nested":{"x":1,"X":2}}`: "the same field",
		`{"list":[{"k":1,"K":2}]}`:              "the same field",
		`{"client":"a` + "\xff" + `b"}`:         "not valid UTF-8",
		`{"client":"a"} {}`:                     "after the JSON value",
		`{"client":"a","nested":{"client":"b"},"list":[{"client":"c"},{"client":"d"}]}`: "",
		`{"nested":{"a":{"b":1}},"client":"x"}`:                                         "",
		`{"client":"a","Client2":1}`:                                                    "unknown field",
	} {
		var b body
		err := decodeStrict([]byte(in), &b)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
}
