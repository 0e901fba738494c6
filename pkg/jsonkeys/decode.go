package jsonkeys

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Unmarshal is json.Unmarshal, reading each field tagged was under its old key as well.
func Unmarshal(data []byte, v any) error {
	return decode(data, v, false)
}

// Decode reads one JSON value from r into v as Unmarshal does; with strict, a key that
// names no field (under its new or its old name) is an error, as with
// json.Decoder.DisallowUnknownFields, and so are what encoding/json takes without a word:
// invalid UTF-8 (it reads U+FFFD instead) and an object with two keys that are the same
// but for case (it takes the last, matching keys to fields whatever their case:
// {"client":"a","CLIENT":"b"} named b).
func Decode(r io.Reader, v any, strict bool) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if strict {
		if err := unambiguous(data); err != nil {
			return err
		}
	}
	return decode(data, v, strict)
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

func decode(data []byte, v any, strict bool) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer && !rv.IsNil() && renamed(rv.Type().Elem()) {
		var tree any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if err := dec.Decode(&tree); err != nil {
			return err
		}
		if err := trailing(dec); err != nil {
			return err
		}
		renameOld(rv.Type().Elem(), tree)
		var err error
		if data, err = json.Marshal(tree); err != nil {
			return err
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return err
	}
	return trailing(dec)
}

// trailing is an error when more than white space follows the value, as json.Unmarshal has
// it.
func trailing(dec *json.Decoder) error {
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("invalid character after the JSON value")
	}
	return nil
}

// renameOld moves each old key of a t in tree to its new key, unless the new key is there
// too, all the way down.
func renameOld(t reflect.Type, tree any) {
	if !renamed(t) {
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		renameOld(t.Elem(), tree)
	case reflect.Slice, reflect.Array:
		if list, ok := tree.([]any); ok {
			for _, item := range list {
				renameOld(t.Elem(), item)
			}
		}
	case reflect.Map:
		if obj, ok := tree.(map[string]any); ok {
			for _, item := range obj {
				renameOld(t.Elem(), item)
			}
		}
	case reflect.Struct:
		obj, ok := tree.(map[string]any)
		if !ok {
			return
		}
		for _, f := range fieldsOf(t) {
			if f.was != "" {
				for key, old := range obj {
					if !strings.EqualFold(key, f.was) || key == f.name {
						continue
					}
					if _, ok := obj[f.name]; !ok {
						obj[f.name] = old
					}
					delete(obj, key)
				}
			}
			if item, ok := obj[f.name]; ok {
				renameOld(f.typ, item)
			}
		}
	}
}
