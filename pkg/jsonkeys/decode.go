package jsonkeys

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// Unmarshal is json.Unmarshal, reading each field tagged was under its old key as well.
func Unmarshal(data []byte, v any) error {
	return decode(data, v, false)
}

// Decode reads one JSON value from r into v as Unmarshal does; with strict, a key that
// names no field (under its new or its old name) is an error, as with
// json.Decoder.DisallowUnknownFields.
func Decode(r io.Reader, v any, strict bool) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	return decode(data, v, strict)
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
