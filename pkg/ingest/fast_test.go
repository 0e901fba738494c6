package ingest

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// writeAccepted writes what writeJSON wrote before it, byte for byte, for every kind of
// clientId and field.
func TestWriteAcceptedMatchesJSON(t *testing.T) {
	nb := time.Date(2026, 12, 24, 18, 0, 0, 123400000, time.UTC)
	cases := []accepted{
		{ID: "01abc", ClientID: "alice", Status: "queued"},
		{ID: "kXYZ", ClientID: `<script>alert("1")</script> & \ back`, Status: "queued", Duplicate: true},
		{ID: "x", ClientID: "é 世界 \u2028 \u2029 \x7f", Status: "queued", NotBefore: nb},
		{ID: "x", ClientID: "bad \xff utf8 \x01\x1f\t\n\r\b\f", Status: "queued", NotBefore: nb.Truncate(time.Second)},
		{ID: "", ClientID: "", Status: ""},
	}
	for _, c := range cases {
		checkAccepted(t, c)
	}
}

func FuzzWriteAccepted(f *testing.F) {
	f.Add("alice", "01abc", false, int64(0))
	f.Add("<&>\u2028\"\\", "k1", true, int64(1798135200123456789))
	f.Fuzz(func(t *testing.T, client, id string, dup bool, nb int64) {
		a := accepted{ID: id, ClientID: client, Status: "queued", Duplicate: dup}
		if nb > 0 {
			a.NotBefore = time.Unix(0, nb).UTC()
		}
		checkAccepted(t, a)
	})
}

func checkAccepted(t *testing.T, a accepted) {
	t.Helper()
	want, got := httptest.NewRecorder(), httptest.NewRecorder()
	writeJSON(want, 202, a)
	writeAccepted(got, a)
	if !bytes.Equal(got.Body.Bytes(), want.Body.Bytes()) || got.Code != want.Code ||
		strings.Join(got.Header().Values("Content-Type"), ",") != strings.Join(want.Header().Values("Content-Type"), ",") {
		t.Errorf("for %+v\nwriteAccepted: %d %v %s\nwriteJSON:     %d %v %s", a, got.Code, got.Header(), got.Body, want.Code, want.Header(), want.Body)
	}
}

var jsonBodies = []string{
	`{}`, `[]`, ` { } `, `{"a":1}`, `{"a":[1,2,{"b":null}],"c":"d"}`, `"s"`, `0`, `-0`, `-0.5e+10`, `1E3`,
	`true`, `false`, `null`, `[true,false,null]`, ` [ 1 , 2 ] `, "\t\n\r{\"a\"\t:\n1}\r\n",
	`{"clientId":"alice","pad":"xxxx"}`, `"\u00e9\"\\\/\b\f\n\r\t"`, "\"\xff\xfe raw bytes\"",
	// invalid
	``, ` `, `{`, `}`, `[`, `]`, `{]`, `[}`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[,1]`, `{,}`,
	`{"a" 1}`, `{a:1}`, `{'a':1}`, `01`, `-`, `1.`, `.5`, `1e`, `1e+`, `+1`, `tru`, `truee`, `nul`,
	`"abc`, `"\x"`, `"\u12"`, `"\u12g4"`, "\"a\x01b\"", `{} {}`, `1 2`, `[1 2]`, `{"a":1 "b":2}`,
	`"\`, `{"a":"\`, `[` + strings.Repeat("[", 70) + strings.Repeat("]", 71),
	strings.Repeat("[", 70) + strings.Repeat("]", 70), strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	strings.Repeat(`{"a":`, 80) + "1" + strings.Repeat("}", 80),
}

// validJSON agrees with json.Valid on every body, valid or not, shallow or deep.
func TestValidJSONAgreesWithEncodingJSON(t *testing.T) {
	for _, b := range jsonBodies {
		checkValidJSON(t, []byte(b))
	}
}

func FuzzValidJSON(f *testing.F) {
	for _, b := range jsonBodies {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkValidJSON(t, b) })
}

func checkValidJSON(t *testing.T, b []byte) {
	t.Helper()
	if got, want := validJSON(b), json.Valid(b); got != want {
		t.Errorf("validJSON(%q) = %v, json.Valid says %v", truncate(string(b), 200), got, want)
	}
}
