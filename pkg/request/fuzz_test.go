package request_test

import (
	"regexp"
	"testing"

	"github.com/penguinhq/dispatcher/pkg/request"
)

var subjectToken = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Any valid clientId becomes one subject token that decodes back to it; any token that
// decodes is the only token of its clientId. The seed corpus (testdata/fuzz) runs as an
// ordinary test; go test -fuzz=FuzzClientID explores further.
func FuzzClientID(f *testing.F) {
	for _, s := range []string{"alice", "a.b", "*", ">", "a.>", "a b", "日本", "\x00", "a\xffb", "", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if err := request.ValidateClientID(id); err != nil {
			return
		}
		tok := request.EncodeClientID(id)
		if !subjectToken.MatchString(tok) {
			t.Fatalf("clientId %q became %q, not a single safe subject token", id, tok)
		}
		back, err := request.DecodeClientID(tok)
		if err != nil || back != id {
			t.Fatalf("clientId %q -> %q -> %q, %v", id, tok, back, err)
		}
	})
}

// Two distinct clientIds never share a subject token.
func FuzzClientIDsStayApart(f *testing.F) {
	f.Add("a.b", "a")
	f.Add("a", "a ")
	f.Add("*", ">")
	f.Add("é", "e\u0301")
	f.Fuzz(func(t *testing.T, a, b string) {
		if a == b || request.ValidateClientID(a) != nil || request.ValidateClientID(b) != nil {
			return
		}
		if request.EncodeClientID(a) == request.EncodeClientID(b) {
			t.Fatalf("clientIds %q and %q share the token %q", a, b, request.EncodeClientID(a))
		}
	})
}

// A token that decodes is canonical: encoding its clientId gives it back, so no two
// subjects hold one client's requests.
func FuzzDecodeClientID(f *testing.F) {
	for _, s := range []string{"YWxpY2U", "YWxpY2U=", "YWxpY2U_", "", "!!", "YQ", "YR"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		id, err := request.DecodeClientID(tok)
		if err != nil {
			return
		}
		if again := request.EncodeClientID(id); again != tok {
			t.Fatalf("token %q decodes to %q, which encodes to %q", tok, id, again)
		}
	})
}

// Idempotency keys: a key is valid or refused, never a panic, and the id it gives is
// the same each time and differs between clients.
func FuzzIdempotencyKey(f *testing.F) {
	f.Add("alice", "k-1")
	f.Add("a", "\t")
	f.Add("a", "")
	f.Fuzz(func(t *testing.T, client, key string) {
		if request.ValidateClientID(client) != nil || request.ValidateIdempotencyKey(key) != nil {
			return
		}
		id := request.IDFromKey("", client, key)
		if id != request.IDFromKey("", client, key) || id == request.IDFromKey("", client+"x", key) {
			t.Fatalf("IDFromKey(%q, %q) is not stable or not per client", client, key)
		}
	})
}
