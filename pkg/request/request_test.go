package request_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

func TestValidateClientID(t *testing.T) {
	t.Parallel()
	cases := []struct {
		id   string
		want error
	}{
		{"alice", nil}, {"a.b", nil}, {"*", nil}, {">", nil}, {"a b", nil}, {"日本語", nil}, {strings.Repeat("x", 128), nil},
		{"", request.ErrClientIDEmpty},
		{strings.Repeat("x", 129), request.ErrClientIDTooLong},
		{"a\xffb", request.ErrClientIDInvalidUTF8},
		{"a\x00b", request.ErrClientIDControl}, {"a\nb", request.ErrClientIDControl}, {"a\u0085b", request.ErrClientIDControl},
	}
	for _, c := range cases {
		if got := request.ValidateClientID(c.id); !errors.Is(got, c.want) {
			t.Errorf("ValidateClientID(%q) = %v, want %v", c.id, got, c.want)
		}
	}
}

func TestEncodeClientIDIsOneSafeToken(t *testing.T) {
	t.Parallel()
	seen := map[string]string{}
	for _, id := range []string{"a.b", "a", "b", "*", ">", "a.>", "a b", "日本語", "ab", "a\u00a0b", "-", "_"} {
		tok := request.EncodeClientID(id)
		if tok == "" || strings.ContainsAny(tok, ".*> \t\r\n") {
			t.Fatalf("token %q for %q is not one safe subject token", tok, id)
		}
		if other, dup := seen[tok]; dup {
			t.Fatalf("%q and %q share the token %q", id, other, tok)
		}
		seen[tok] = id
		back, err := request.DecodeClientID(tok)
		if err != nil || back != id {
			t.Fatalf("round trip of %q gave %q, %v", id, back, err)
		}
	}
}

func FuzzClientIDCodec(f *testing.F) {
	for _, s := range []string{"alice", "a.b", "*", ">", "日本語", "a b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if request.ValidateClientID(id) != nil {
			return
		}
		tok := request.EncodeClientID(id)
		if strings.ContainsAny(tok, ".*> \t\r\n") {
			t.Fatalf("token %q for %q is not one safe subject token", tok, id)
		}
		if back, err := request.DecodeClientID(tok); err != nil || back != id {
			t.Fatalf("round trip of %q gave %q, %v", id, back, err)
		}
	})
}

func TestIDs(t *testing.T) {
	t.Parallel()
	now := time.Now()
	a, b := request.NewID(now), request.NewID(now.Add(time.Millisecond))
	if a == b || len(a) != 26 || a >= b {
		t.Fatalf("NewID gave %q then %q: want distinct, 26 characters, sorted by time", a, b)
	}
	if first, again := request.IDFromKey("", "c", "k"), request.IDFromKey("", "c", "k"); first != again {
		t.Fatal("the same client and key give different ids")
	}
	if request.IDFromKey("", "c", "k") == request.IDFromKey("", "d", "k") || request.IDFromKey("", "c\x00", "k") == request.IDFromKey("", "c", "\x00k") {
		t.Fatal("different clients or keys share an id")
	}
	// A key is the tenant's: another tenant (or none) sending the same client and key
	// names another request.
	if a, b := request.IDFromKey("acme", "alice", "order-1"), request.IDFromKey("globex", "alice", "order-1"); a == b || a == request.IDFromKey("", "alice", "order-1") ||
		request.IDFromKey("a", "bc", "k") == request.IDFromKey("ab", "c", "k") {
		t.Error("two tenants (or a tenant and none) with the same client and key share an id")
	}
}

func ExampleEncodeClientID() {
	fmt.Println(request.EncodeClientID("a.b"), request.EncodeClientID(">"))
	// Output: YS5i Pg
}

// RequestSubject builds in one allocation what the prefix and the token make, for
// clientIds of every length (longer than its stack buffer too).
func TestRequestSubjectIsPrefixAndToken(t *testing.T) {
	for _, n := range []int{1, 2, 3, 127, 128, 129, 200, 1000} {
		id := strings.Repeat("é", n/2) + strings.Repeat("x", n%2)
		if got, want := request.RequestSubject(id), request.RequestPrefix+request.EncodeClientID(id); got != want {
			t.Fatalf("RequestSubject of a %d-byte clientId = %q, want %q", len(id), got, want)
		}
	}
}

// ParseTime takes what RFC 3339 allows and Go's time package does not (a lower-case t or
// z, a leap second), reads the rest as Go does, and refuses what neither takes.
func TestParseTimeTakesRFC3339AsWritten(t *testing.T) {
	want := time.Date(2026, 12, 24, 18, 0, 0, 0, time.UTC)
	for v, w := range map[string]time.Time{
		"2026-12-24T18:00:00Z":        want,
		"2026-12-24t18:00:00z":        want,
		"2026-12-24t18:00:00Z":        want,
		"2026-12-24T18:00:00z":        want,
		"2026-12-24T19:00:00+01:00":   want,
		"2026-12-24t19:00:00.5+01:00": want.Add(500 * time.Millisecond),
		"2016-12-31T23:59:60Z":        time.Date(2017, 1, 1, 0, 0, 0, 0, time.UTC),
		"2016-12-31t23:59:60.250z":    time.Date(2017, 1, 1, 0, 0, 0, 250e6, time.UTC),
		"2017-01-01T00:59:60+01:00":   time.Date(2017, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		got, err := request.ParseTime(v)
		if err != nil || !got.Equal(w) {
			t.Errorf("%q: %v (%v), want %v", v, got, err, w)
		}
	}
	for _, v := range []string{"", "2026-12-24", "2026-12-24 18:00:00Z", "2026-12-24T18:00:00", "2026-12-24T18:00:61Z", "2026-12-24T18:60:00Z", "2026-12-24x18:00:00z", "2026-12-24T18:00:00y", "2026-12-24T18:00:600Z", "2026-12-24T17:59:60Z", "2016-12-31T22:59:60Z"} {
		if got, err := request.ParseTime(v); err == nil {
			t.Errorf("%q: read as %v, want refused", v, got)
		}
	}
}
