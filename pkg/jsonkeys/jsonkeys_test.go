package jsonkeys_test

import (
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/jsonkeys"
)

type Inner struct {
	LastStatus int       `json:"lastStatus,omitempty" was:"last_status"`
	At         time.Time `json:"at,omitzero"`
}

type outer struct {
	Inner
	MaxRate  int               `json:"maxRate" was:"max_rate"`
	Note     string            `json:"note,omitempty"`
	Counts   map[string]int    `json:"counts"`
	Nested   *Inner            `json:"nested,omitempty"`
	List     []Inner           `json:"list"`
	ByClient map[string]*Inner `json:"byClient" was:"by_client"`
	Any      any               `json:"any"`
	Hidden   string            `json:"-"`
	Markup   string            `json:"markup"`
	Duration time.Duration     `json:"durationNs,omitzero" was:"duration_ns"`
}

func sample() outer {
	at := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	return outer{
		Inner:    Inner{LastStatus: 503, At: at},
		MaxRate:  7,
		Counts:   map[string]int{"max_rate": 1, "b": 2}, // a map's keys are data, never renamed
		Nested:   &Inner{LastStatus: 429},
		List:     []Inner{{LastStatus: 1}, {}},
		ByClient: map[string]*Inner{"last_status": {LastStatus: 2}, "nil": nil},
		Any:      Inner{LastStatus: 3},
		Hidden:   "x",
		Markup:   "<token> & co",
		Duration: time.Second,
	}
}

func decodeTree(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var tree map[string]any
	if err := json.Unmarshal(b, &tree); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b)
	}
	return tree
}

func TestMarshalWritesBothKeysAndIsOtherwiseEncodingJSON(t *testing.T) {
	v := sample()
	got, err := jsonkeys.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(got), `"markup":"<token> & co"`) {
		t.Errorf("<, > and & escaped: %s", got)
	}
	tree := decodeTree(t, got)
	for newKey, old := range map[string]string{"maxRate": "max_rate", "lastStatus": "last_status", "byClient": "by_client", "durationNs": "duration_ns"} {
		if tree[old] == nil || !reflect.DeepEqual(tree[newKey], tree[old]) {
			t.Errorf("%s = %v, %s = %v: want both, equal", newKey, tree[newKey], old, tree[old])
		}
	}
	if !strings.Contains(string(got), `"maxRate":7,"max_rate":7`) {
		t.Errorf("the old key does not follow the new one: %s", got)
	}
	for _, path := range [][]string{{"nested", "last_status"}, {"any", "last_status"}, {"byClient", "last_status", "last_status"}} {
		var at any = tree
		for _, k := range path {
			at = at.(map[string]any)[k]
		}
		if at == nil {
			t.Errorf("%v: the old key is not written inside", path)
		}
	}
	if _, ok := tree["counts"].(map[string]any)["maxRate"]; ok {
		t.Error("a map's data key was renamed")
	}
	// Without the old keys (the nested ones included), it is what encoding/json writes.
	want, _ := json.Marshal(v)
	strip := func(m map[string]any) {
		for _, k := range []string{"max_rate", "last_status", "by_client", "duration_ns"} {
			delete(m, k)
		}
	}
	strip(tree)
	strip(tree["nested"].(map[string]any))
	strip(tree["any"].(map[string]any))
	strip(tree["byClient"].(map[string]any)["last_status"].(map[string]any))
	for _, item := range tree["list"].([]any) {
		strip(item.(map[string]any))
	}
	if wantTree := decodeTree(t, want); !reflect.DeepEqual(tree, wantTree) {
		t.Errorf("without the old keys:\n got %v\nwant %v", tree, wantTree)
	}
}

func TestMarshalOfValuesWithoutRenamedKeysIsEncodingJSON(t *testing.T) {
	for _, v := range []any{nil, 3, "a<b", []int{1}, map[string]int{"a": 1}, struct {
		A int `json:"a_b"`
	}{1}, (*outer)(nil), []outer(nil), map[string]outer(nil)} {
		got, err := jsonkeys.Marshal(v)
		want, _ := json.Marshal(v)
		if err != nil || strings.ReplaceAll(string(want), `\u003c`, "<") != string(got) {
			t.Errorf("%#v: got %s, %v; want %s", v, got, err, want)
		}
	}
}

func TestUnmarshalReadsEitherKey(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     int
	}{
		{"new", `{"maxRate": 5}`, 5},
		{"old", `{"max_rate": 6}`, 6},
		{"both: the new one wins", `{"max_rate": 6, "maxRate": 5}`, 5},
	} {
		var v outer
		if err := jsonkeys.Unmarshal([]byte(tc.in), &v); err != nil || v.MaxRate != tc.want {
			t.Errorf("%s: MaxRate %d, %v; want %d", tc.name, v.MaxRate, err, tc.want)
		}
	}
	var v outer
	in := `{"last_status": 1, "nested": {"last_status": 2}, "list": [{"last_status": 3}],
		"by_client": {"last_status": {"last_status": 4}}, "counts": {"max_rate": 5}, "duration_ns": 6}`
	if err := jsonkeys.Unmarshal([]byte(in), &v); err != nil {
		t.Fatal(err)
	}
	if v.LastStatus != 1 || v.Nested.LastStatus != 2 || v.List[0].LastStatus != 3 ||
		v.ByClient["last_status"].LastStatus != 4 || v.Counts["max_rate"] != 5 || v.Duration != 6 {
		t.Errorf("old keys at every depth: %+v, nested %+v, list %+v, byClient %+v", v, v.Nested, v.List, v.ByClient)
	}
	// What it writes, it reads back.
	b, _ := jsonkeys.Marshal(sample())
	var back outer
	if err := jsonkeys.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	want := sample()
	want.Hidden, want.Any = "", nil
	back.Any = nil
	if !reflect.DeepEqual(back, want) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, want)
	}
}

func TestDecodeStrictRefusesWhatNamesNoField(t *testing.T) {
	var v outer
	if err := jsonkeys.Decode(strings.NewReader(`{"max_rate": 1, "note": "n"}`), &v, true); err != nil || v.MaxRate != 1 {
		t.Errorf("an old key is no unknown field: %v, %d", err, v.MaxRate)
	}
	err := jsonkeys.Decode(strings.NewReader(`{"maxrate_x": 1}`), &v, true)
	if err == nil || !strings.Contains(err.Error(), "maxrate_x") {
		t.Errorf("unknown key: %v", err)
	}
	if err := jsonkeys.Decode(strings.NewReader(`{"maxRate": 1} {}`), &v, true); err == nil {
		t.Error("a second value after the first was taken")
	}
	if err := jsonkeys.Unmarshal([]byte(`{"max_rate": "seven"}`), &v); err == nil {
		t.Error("a string for a number was taken")
	}
	if err := jsonkeys.Unmarshal([]byte(`[1`), &v); err == nil {
		t.Error("broken JSON was taken")
	}
}

type hidden struct {
	Old int `json:"new" was:"old"`
}

type embedsUnexported struct {
	hidden
}

type plainUnexported struct {
	hidden2
}

type hidden2 struct{ A int }

type ptrMarshaler struct{}

func (p *ptrMarshaler) MarshalJSON() ([]byte, error) { return []byte(`"by pointer"`), nil }

type holdsPtrMarshaler struct {
	M    ptrMarshaler `json:"m"`
	Rate int          `json:"rate" was:"the_rate"`
}

func TestWhatMarshalCannotWriteAsEncodingJSONIsAnError(t *testing.T) {
	if b, err := jsonkeys.Marshal(embedsUnexported{hidden{1}}); !errors.Is(err, jsonkeys.ErrUnsupported) {
		t.Errorf("a renamed field in an unexported embedded struct was written: %s", b)
	}
	if b, err := jsonkeys.Marshal(plainUnexported{hidden2{1}}); err != nil || string(b) != `{"A":1}` {
		t.Errorf("a struct without renamed fields is encoding/json's: %s, %v", b, err)
	}
	// A field's pointer method is called, as encoding/json calls it on an addressable field.
	v := &holdsPtrMarshaler{Rate: 2}
	b, err := jsonkeys.Marshal(v)
	want, _ := json.Marshal(v)
	if err != nil || string(b) != `{"m":"by pointer","rate":2,"the_rate":2}` || !strings.Contains(string(want), `"by pointer"`) {
		t.Errorf("got %s, %v; encoding/json writes %s", b, err, want)
	}
}

func TestUnmarshalReadsTheOldKeyInAnyCaseAsEncodingJSONDid(t *testing.T) {
	var v outer
	if err := jsonkeys.Decode(strings.NewReader(`{"Max_Rate": 4}`), &v, true); err != nil || v.MaxRate != 4 {
		t.Errorf("Max_Rate: %d, %v", v.MaxRate, err)
	}
}

func TestEncodeIsMarshalWithANewline(t *testing.T) {
	for _, v := range []any{sample(), map[string]string{"a": "<b>"}, nil} {
		var buf strings.Builder
		if err := jsonkeys.Encode(&buf, v); err != nil {
			t.Fatal(err)
		}
		want, _ := jsonkeys.Marshal(v)
		if buf.String() != string(want)+"\n" {
			t.Errorf("Encode %s, Marshal %s", buf.String(), want)
		}
	}
	if err := jsonkeys.Encode(io.Discard, embedsUnexported{}); !errors.Is(err, jsonkeys.ErrUnsupported) {
		t.Errorf("Encode of what it cannot write: %v", err)
	}
}

// A strict decode refuses what encoding/json would take without a word: invalid UTF-8,
// and two keys of one object that name the same field but for case (the last won: an
// admin purge of {"client":"nobody","CLIENT":"kim"} purged kim). Keys alike in different
// objects, and the same key at different depths, are fine.
func TestStrictDecodeRefusesAmbiguousKeys(t *testing.T) {
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
		`{"client":"a","nested":{"client":"b"},"list":[{"client":"c"},{"client":"d"}]}`: "",
		`{"nested":{"a":{"b":1}},"client":"x"}`:                                         "",
		`{"client":"a","Client2":1}`:                                                    "unknown field",
	} {
		var b body
		err := jsonkeys.Decode(strings.NewReader(in), &b, true)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
	var b body
	if err := jsonkeys.Decode(strings.NewReader(`{"client":"a","CLIENT":"b"}`), &b, false); err != nil {
		t.Errorf("not strict: %v, want encoding/json's reading, whichever key it takes", err)
	}
}
