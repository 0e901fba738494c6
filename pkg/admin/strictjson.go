package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// decodeStrict reads data, one JSON value, into v. A key that names no field is an error,
// and so are what encoding/json takes without a word: invalid UTF-8 (it reads U+FFFD
// instead) and an object with two keys that are the same but for case (it takes the last,
// matching keys to fields whatever their case: {"client":"a","CLIENT":"b"} named b).
func decodeStrict(data []byte, v any) error {
	if err := unambiguous(data); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("invalid character after the JSON value")
	}
	return nil
}

// foldKey is s with each letter as the least of its case-folding orbit: two keys that
// strings.EqualFold (and encoding/json's field matching) take for the same have the same.
func foldKey(s string) string {
	var b strings.Builder
	for _, r := range s {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}

// unambiguous is an error when data is not UTF-8, or holds an object with two keys equal
// but for case. Syntax errors are left to the decoding, which says where.
func unambiguous(data []byte) error {
	if !utf8.Valid(data) {
		return errors.New("the JSON is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	// The values open: an object's keys so far (folded: as sent), and whether a key comes
	// next in it; an array has no keys.
	type open struct {
		keys   map[string]string
		keyNow bool
	}
	var stack []open
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil // the end, or a syntax error: the decoding says which
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				stack = append(stack, open{keys: map[string]string{}, keyNow: true})
				continue
			case '[':
				stack = append(stack, open{})
				continue
			}
			stack = stack[:len(stack)-1] // a close: the value it ends was read (below)
		case string:
			if n := len(stack); n > 0 && stack[n-1].keyNow {
				folded := foldKey(t)
				if first, ok := stack[n-1].keys[folded]; ok {
					return fmt.Errorf("the keys %q and %q of one object name the same field: give it once", first, t)
				}
				stack[n-1].keys[folded], stack[n-1].keyNow = t, false
				continue
			}
		}
		if n := len(stack); n > 0 && stack[n-1].keys != nil {
			stack[n-1].keyNow = true // a value read: a key comes next
		}
	}
}
