package request

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
)

// Subjects. A request is stored on "dispatch.req.<partition>.<token>": the token is
// EncodeClientID of the clientId, and the partition is worked out from the token by the
// request stream's subject transform (ingest publishes to "dispatch.req.<token>"). A dead
// letter is stored on "dispatch.dead.<token>". A final event the events stream did not
// take in time is kept in the request stream on "dispatch.outcome.<token>" until it does
// (ADR 9).
const (
	RequestPrefix    = "dispatch.req."
	DeadLetterPrefix = "dispatch.dead."
	OutcomePrefix    = "dispatch.outcome."
)

// RequestSubject is where a client's requests are published (the stream adds the
// partition).
func RequestSubject(clientID string) string {
	var buf [256]byte // a clientId of up to 128 bytes fits: one allocation, the string
	b := append(buf[:0], RequestPrefix...)
	return string(base64.RawURLEncoding.AppendEncode(b, []byte(clientID)))
}

// DeadLetterSubject is where a client's dead letters are stored.
func DeadLetterSubject(clientID string) string { return DeadLetterPrefix + EncodeClientID(clientID) }

// OutcomeSubject is where a final event of a client's request is kept in the request
// stream while the events stream does not take it.
func OutcomeSubject(clientID string) string { return OutcomePrefix + EncodeClientID(clientID) }

// ClientToken is the part of a subject that names the client: its last token.
func ClientToken(subject string) string { return subject[strings.LastIndexByte(subject, '.')+1:] }

// TokenOf returns the client token of a stored request (or dead letter) subject, after
// checking that it is one.
func TokenOf(subject string) (string, error) {
	if !strings.HasPrefix(subject, RequestPrefix) && !strings.HasPrefix(subject, DeadLetterPrefix) || ClientToken(subject) == "" {
		return "", fmt.Errorf("subject %q is not a request subject", subject)
	}
	return ClientToken(subject), nil
}

// ClientIDOf returns the clientId a stored request (or dead letter) subject belongs to.
func ClientIDOf(subject string) (string, error) {
	token, err := TokenOf(subject)
	if err != nil {
		return "", err
	}
	return DecodeClientID(token)
}

// PartitionOf returns the partition of a stored request subject.
func PartitionOf(subject string) (int, error) {
	rest, ok := strings.CutPrefix(subject, RequestPrefix)
	if !ok {
		return 0, fmt.Errorf("subject %q is not a request subject", subject)
	}
	p, _, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, fmt.Errorf("subject %q has no partition", subject)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		return 0, fmt.Errorf("subject %q: partition %q: %w", subject, p, err)
	}
	return n, nil
}
