package webhook_test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/webhook"
)

// The specification's own test vector, as the Standard Webhooks reference libraries test
// it.
const (
	specSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	specID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	specTimestamp = 1614265330
	specPayload   = `{"test": 2432232314}`
	specSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func mustSecrets(t testing.TB, s string) []webhook.Secret {
	t.Helper()
	secrets, err := webhook.ParseSecrets(s)
	if err != nil {
		t.Fatal(err)
	}
	return secrets
}

// Sign gives the specification's signature for its test vector, sets the three headers,
// and Verify accepts them.
func TestSpecVector(t *testing.T) {
	t.Parallel()
	secrets := mustSecrets(t, specSecret)
	if got := secrets[0].Signature(specID, specTimestamp, []byte(specPayload)); got != specSignature {
		t.Fatalf("signature %s, want the specification's %s", got, specSignature)
	}
	at := time.Unix(specTimestamp, 0)
	h := http.Header{}
	webhook.Sign(h, secrets, specID, at, []byte(specPayload))
	if h.Get("webhook-id") != specID || h.Get("webhook-timestamp") != "1614265330" || h.Get("webhook-signature") != specSignature {
		t.Fatalf("headers %v", h)
	}
	if err := webhook.Verify(secrets, h, []byte(specPayload), at.Add(time.Minute)); err != nil {
		t.Fatalf("Verify: %v", err)
	}
}

// While a secret rotates, each attempt carries one signature per secret, and a raven
// holding either secret alone accepts it.
func TestRotation(t *testing.T) {
	t.Parallel()
	const other = "whsec_" + "c2Vjb25kLWtleS1vZi10aGlydHktdHdvLWJ5dGVzISE=" // 32 bytes
	both := mustSecrets(t, specSecret+"  "+other)
	h := http.Header{}
	now := time.Unix(1_700_000_000, 0)
	webhook.Sign(h, both, "id-1", now, []byte("body"))
	if sigs := strings.Fields(h.Get("webhook-signature")); len(sigs) != 2 || sigs[0] == sigs[1] {
		t.Fatalf("webhook-signature %q, want two different signatures", h.Get("webhook-signature"))
	}
	for i, s := range both {
		if err := webhook.Verify([]webhook.Secret{s}, h, []byte("body"), now); err != nil {
			t.Errorf("secret %d alone: %v", i+1, err)
		}
	}
	if err := webhook.Verify(mustSecrets(t, "whsec_"+strings.Repeat("A", 32)), h, []byte("body"), now); !errors.Is(err, webhook.ErrNoMatch) {
		t.Errorf("a third secret: %v, want ErrNoMatch", err)
	}
}

// Verify refuses what was altered, replayed late, sent from the future or not signed.
func TestVerifyRefuses(t *testing.T) {
	t.Parallel()
	secrets := mustSecrets(t, specSecret)
	at := time.Unix(specTimestamp, 0)
	signed := func() http.Header {
		h := http.Header{}
		webhook.Sign(h, secrets, specID, at, []byte(specPayload))
		return h
	}
	for _, c := range []struct {
		name string
		h    func() http.Header
		body string
		now  time.Time
		want error
	}{
		{"TamperedBody", signed, `{"test": 2432232315}`, at, webhook.ErrNoMatch},
		{"OtherID", func() http.Header { h := signed(); h.Set("webhook-id", "msg_other"); return h }, specPayload, at, webhook.ErrNoMatch},
		{"OtherTimestamp", func() http.Header { h := signed(); h.Set("webhook-timestamp", "1614265331"); return h }, specPayload, at, webhook.ErrNoMatch},
		{"Old", signed, specPayload, at.Add(webhook.Tolerance + time.Second), webhook.ErrStale},
		{"Future", signed, specPayload, at.Add(-webhook.Tolerance - time.Second), webhook.ErrStale},
		{"BadTimestamp", func() http.Header { h := signed(); h.Set("webhook-timestamp", "yesterday"); return h }, specPayload, at, webhook.ErrBadTimestamp},
		{"Unsigned", func() http.Header { return http.Header{} }, specPayload, at, webhook.ErrMissingHeaders},
		{"NoSignature", func() http.Header { h := signed(); h.Del("webhook-signature"); return h }, specPayload, at, webhook.ErrMissingHeaders},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := webhook.Verify(secrets, c.h(), []byte(c.body), c.now); !errors.Is(err, c.want) {
				t.Fatalf("Verify: %v, want %v", err, c.want)
			}
		})
	}
	if err := webhook.Verify(secrets, signed(), []byte(specPayload), at.Add(webhook.Tolerance)); err != nil {
		t.Errorf("at the edge of the tolerance: %v", err)
	}
}

// A bad secret is refused with a reason that never contains it.
func TestParseSecretRefuses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, secret, want string }{
		{"NoPrefix", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "begins with whsec_"},
		{"NotBase64", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2La!aSw", "base64"},
		{"ShortKey", "whsec_c2hvcnQta2V5", "9 bytes"},
		{"LongKey", "whsec_" + strings.Repeat("QUFB", 22), "66 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := webhook.ParseSecrets(specSecret + " " + c.secret)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "secret 2 of 2") {
				t.Fatalf("err %v, want one saying %q of secret 2", err, c.want)
			}
			if strings.Contains(err.Error(), strings.TrimPrefix(c.secret, "whsec_")) {
				t.Fatalf("the error shows the secret: %v", err)
			}
		})
	}
	s := mustSecrets(t, specSecret)[0]
	if text := fmt.Sprint(s, []webhook.Secret{s}); strings.Contains(text, "MfKQ") || !strings.Contains(text, "hidden") {
		t.Errorf("a printed secret shows %q", text)
	}
	if none, err := webhook.ParseSecrets("  "); err != nil || none != nil {
		t.Errorf("no secrets: %v %v", none, err)
	}
}

// Raven checks each request before it acts on it: read the body whole, then Verify.
func ExampleVerify() {
	secrets, err := webhook.ParseSecrets(specSecret) // RAVEN_SIGNING_SECRET
	if err != nil {
		panic(err)
	}
	h := http.Header{} // the request's headers, as the dispatcher sent them
	webhook.Sign(h, secrets, specID, time.Unix(specTimestamp, 0), []byte(specPayload))

	err = webhook.Verify(secrets, h, []byte(specPayload), time.Unix(specTimestamp+10, 0))
	fmt.Println(err)
	err = webhook.Verify(secrets, h, []byte(`{"test": 1}`), time.Unix(specTimestamp+10, 0))
	fmt.Println(err)
	// Output:
	// <nil>
	// webhook: no signature matches
}
