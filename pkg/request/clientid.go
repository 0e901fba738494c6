package request

import (
	"encoding/base64"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxClientIDBytes is the longest clientId accepted, in bytes.
const MaxClientIDBytes = 128

// Errors returned by ValidateClientID. Each says what is wrong in words a caller can act on.
var (
	ErrClientIDEmpty       = errors.New("clientId is empty")
	ErrClientIDTooLong     = fmt.Errorf("clientId is longer than %d bytes", MaxClientIDBytes)
	ErrClientIDInvalidUTF8 = errors.New("clientId is not valid UTF-8")
	ErrClientIDControl     = errors.New("clientId contains a control character")
	ErrClientIDSpace       = errors.New("clientId starts or ends with a space")
)

// ValidateNewClientID is what ingest takes for a new request's client: ValidateClientID's
// rules, and no space at either end. Raven reads the clientId from the X-Client-Id header,
// and HTTP drops a header value's spaces at its ends: " alice" and "alice" would be two
// clients here, spaced apart from each other, and one client to raven. (A tab is a
// control character, refused already.) Clients stored before this rule still validate
// with ValidateClientID, so that they can be read and steered.
func ValidateNewClientID(id string) error {
	if err := ValidateClientID(id); err != nil {
		return err
	}
	if id[0] == ' ' || id[len(id)-1] == ' ' {
		return ErrClientIDSpace
	}
	return nil
}

// ValidateClientID reports whether id can name a client: 1 to MaxClientIDBytes bytes of
// valid UTF-8 without control characters. Any other content, dots, wildcards, spaces and
// non-ASCII letters included, is valid: EncodeClientID makes it safe for a subject.
func ValidateClientID(id string) error {
	switch {
	case id == "":
		return ErrClientIDEmpty
	case len(id) > MaxClientIDBytes:
		return ErrClientIDTooLong
	case !utf8.ValidString(id):
		return ErrClientIDInvalidUTF8
	}
	for _, r := range id {
		if unicode.IsControl(r) {
			return ErrClientIDControl
		}
	}
	return nil
}

// EncodeClientID turns a clientId into exactly one NATS subject token: unpadded base64url,
// whose alphabet (A-Z a-z 0-9 - _) holds no dot, wildcard or whitespace. The encoding is
// one-to-one, so two distinct clientIds never share a subject.
func EncodeClientID(id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(id))
}

// DecodeClientID reverses EncodeClientID. Only the token EncodeClientID makes is
// accepted: the decoder would skip line breaks, so one clientId could otherwise be read
// from several tokens.
func DecodeClientID(token string) (string, error) {
	b, err := base64.RawURLEncoding.Strict().DecodeString(token)
	if err != nil {
		return "", fmt.Errorf("decoding clientId token %q: %w", token, err)
	}
	if len(b) == 0 || EncodeClientID(string(b)) != token {
		return "", fmt.Errorf("decoding clientId token %q: not the canonical token of a clientId", token)
	}
	return string(b), nil
}
