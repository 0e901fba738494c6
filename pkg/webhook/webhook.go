// Package webhook signs requests and verifies their signatures as the Standard Webhooks
// specification (https://www.standardwebhooks.com) says, so that raven can tell that a
// request came from the dispatcher, unaltered, and recently.
//
// A request carries three headers: webhook-id (the request's Idempotency-Key),
// webhook-timestamp (unix seconds, when the attempt was made) and webhook-signature: one
// "v1,<base64 HMAC-SHA256 of id.timestamp.body>" per secret, space-separated, so that
// raven may hold either the old or the new secret while one is rotated.
//
// The package uses the standard library only: a raven written in Go may import it or
// copy it.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The headers of a signed request.
const (
	HeaderID        = "Webhook-Id"
	HeaderTimestamp = "Webhook-Timestamp"
	HeaderSignature = "Webhook-Signature"
)

// Tolerance is how far a request's timestamp may be from the verifier's clock, either
// way, for Verify to accept it: the specification's five minutes.
const Tolerance = 5 * time.Minute

// SecretPrefix begins every secret: the rest is the key, in standard base64.
const SecretPrefix = "whsec_"

// The bounds of a key, in bytes, as the specification gives them.
const (
	MinKeyBytes = 24
	MaxKeyBytes = 64
)

// Secret is one signing key. Its text form hides the key.
type Secret struct{ key []byte }

// String hides the key, so that a Secret printed by mistake does not give it away.
func (Secret) String() string { return SecretPrefix + "(hidden)" }

// ParseSecret reads one secret: "whsec_" and the base64 of a key of 24 to 64 bytes. Its
// errors never contain the secret.
func ParseSecret(s string) (Secret, error) {
	b64, ok := strings.CutPrefix(s, SecretPrefix)
	if !ok {
		return Secret{}, errors.New("a secret begins with " + SecretPrefix + " (whsec_ followed by the key in base64)")
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return Secret{}, errors.New("what follows " + SecretPrefix + " is not standard base64")
	}
	if len(key) < MinKeyBytes || len(key) > MaxKeyBytes {
		return Secret{}, fmt.Errorf("the key is %d bytes; it must be %d to %d (openssl rand -base64 32 makes one)", len(key), MinKeyBytes, MaxKeyBytes)
	}
	return Secret{key: key}, nil
}

// ParseSecrets reads space-separated secrets (several while one is rotated); an empty
// text is none.
func ParseSecrets(s string) ([]Secret, error) {
	var out []Secret
	for i, one := range strings.Fields(s) {
		sec, err := ParseSecret(one)
		if err != nil {
			return nil, fmt.Errorf("secret %d of %d: %w", i+1, len(strings.Fields(s)), err)
		}
		out = append(out, sec)
	}
	return out, nil
}

// Signature is the signature of one message under s: "v1," and the base64 of the
// HMAC-SHA256 of "id.timestamp.body", timestamp in unix seconds.
func (s Secret) Signature(id string, timestamp int64, body []byte) string {
	mac := hmac.New(sha256.New, s.key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write(strconv.AppendInt(nil, timestamp, 10))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// Sign sets h's webhook headers for a message of id and body sent at the time given,
// with one signature per secret. Without secrets it sets nothing.
func Sign(h http.Header, secrets []Secret, id string, at time.Time, body []byte) {
	if len(secrets) == 0 {
		return
	}
	ts := at.Unix()
	sigs := make([]string, len(secrets))
	for i, s := range secrets {
		sigs[i] = s.Signature(id, ts, body)
	}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	h.Set(HeaderSignature, strings.Join(sigs, " "))
}

// The reasons Verify refuses a request.
var (
	ErrMissingHeaders = errors.New("webhook: the webhook-id, webhook-timestamp or webhook-signature header is missing")
	ErrBadTimestamp   = errors.New("webhook: webhook-timestamp is not unix seconds")
	ErrStale          = errors.New("webhook: webhook-timestamp is more than 5 minutes from now")
	ErrNoMatch        = errors.New("webhook: no signature matches")
)

// Verify checks a request's webhook headers and its body against secrets, any of which
// may have signed it, at the time now. It returns nil when a v1 signature matches under
// one of the secrets and the timestamp is within Tolerance of now; otherwise one of the
// Err values above (answer 401).
func Verify(secrets []Secret, h http.Header, body []byte, now time.Time) error {
	id, tsText, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || tsText == "" || sigs == "" {
		return ErrMissingHeaders
	}
	ts, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return ErrBadTimestamp
	}
	if d := now.Sub(time.Unix(ts, 0)); d > Tolerance || d < -Tolerance {
		return ErrStale
	}
	for _, s := range secrets {
		want := []byte(s.Signature(id, ts, body))
		for _, got := range strings.Fields(sigs) {
			if hmac.Equal([]byte(got), want) {
				return nil
			}
		}
	}
	return ErrNoMatch
}
