// Package jsonkeys renames JSON keys without breaking their readers. A struct field whose
// key changed keeps its old key in a was tag beside its json tag:
//
//	MaxRate int `json:"maxRate" was:"max_rate"`
//
// Marshal writes such a field under both keys, the new one first; Unmarshal and Decode read
// it under either (the new one wins when both are there; the old one, as encoding/json
// reads keys, in any case). That is the one version in which a reader that knows only the
// old key, or a record stored before the rename, still works; the next version drops the
// was tags. Otherwise it writes what encoding/json writes, but for these: <, > and & are
// not escaped (no answer is embedded in HTML); a struct that holds a renamed field may not
// embed an unexported struct or use the ",string" option, and a map that holds one must
// have string keys (each is an error, not a different output); and a value that holds
// itself is not detected. pkg/openapi's tests hold every renamed type of the project to
// encoding/json's output.
//
// Only keys named by a struct's fields are renamed: a map's keys are data (client ids,
// subjects, status codes) and are never touched.
package jsonkeys

import (
	"bytes"
	"cmp"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"sync"
)

// Marshal is json.Marshal, with each field tagged was written a second time under its old
// key.
func Marshal(v any) ([]byte, error) {
	var e encoder
	if err := e.value(reflect.ValueOf(v)); err != nil {
		return nil, err
	}
	return e.buf.Bytes(), nil
}

// ErrUnsupported is what Marshal returns for a renamed type it cannot write as
// encoding/json would (see the package's doc); nothing is written then.
var ErrUnsupported = errors.New("jsonkeys: not supported in a type with a renamed field")

// Encode writes v to w as Marshal does, and a newline, as json.Encoder's Encode does
// with SetEscapeHTML(false). A value that holds no renamed field is streamed by
// encoding/json itself, without a copy.
func Encode(w io.Writer, v any) error {
	if v == nil || !renamed(reflect.TypeOf(v)) {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		return enc.Encode(v)
	}
	b, err := Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// MarshalIndent is Marshal, indented as json.MarshalIndent indents.
func MarshalIndent(v any, prefix, indent string) ([]byte, error) {
	b, err := Marshal(v)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, prefix, indent); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

type encoder struct{ buf bytes.Buffer }

func (e *encoder) value(v reflect.Value) error {
	if !v.IsValid() {
		e.buf.WriteString("null")
		return nil
	}
	if !renamed(v.Type()) {
		return e.leaf(v)
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			e.buf.WriteString("null")
			return nil
		}
		return e.value(v.Elem())
	case reflect.Slice:
		if v.IsNil() {
			e.buf.WriteString("null")
			return nil
		}
		return e.list(v)
	case reflect.Array:
		return e.list(v)
	case reflect.Map:
		return e.object(v)
	case reflect.Struct:
		return e.fields(v)
	}
	return e.leaf(v)
}

// leaf is a value that holds no renamed key: encoding/json writes it (through its
// address when that is how its method writes it, as encoding/json does for a field).
func (e *encoder) leaf(v reflect.Value) error {
	enc := json.NewEncoder(&e.buf)
	enc.SetEscapeHTML(false)
	x := v.Interface()
	if v.CanAddr() && v.Kind() != reflect.Pointer {
		if pt := reflect.PointerTo(v.Type()); pt.Implements(marshalerType) || pt.Implements(textMarshalerType) {
			x = v.Addr().Interface()
		}
	}
	if err := enc.Encode(x); err != nil {
		return err
	}
	e.buf.Truncate(e.buf.Len() - 1) // Encode's newline
	return nil
}

func (e *encoder) list(v reflect.Value) error {
	e.buf.WriteByte('[')
	for i := range v.Len() {
		if i > 0 {
			e.buf.WriteByte(',')
		}
		if err := e.value(v.Index(i)); err != nil {
			return err
		}
	}
	e.buf.WriteByte(']')
	return nil
}

// object writes a map with string keys, sorted as encoding/json sorts them.
func (e *encoder) object(v reflect.Value) error {
	if v.IsNil() {
		e.buf.WriteString("null")
		return nil
	}
	if v.Type().Key().Kind() != reflect.String {
		return fmt.Errorf("%w: a map keyed by %s", ErrUnsupported, v.Type().Key())
	}
	keys := v.MapKeys()
	slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
	e.buf.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			e.buf.WriteByte(',')
		}
		if err := e.leaf(reflect.ValueOf(k.String())); err != nil {
			return err
		}
		e.buf.WriteByte(':')
		if err := e.value(v.MapIndex(k)); err != nil {
			return err
		}
	}
	e.buf.WriteByte('}')
	return nil
}

func (e *encoder) fields(v reflect.Value) error {
	fs := fieldsOf(v.Type())
	if err := info(v.Type()).err; err != nil {
		return err
	}
	e.buf.WriteByte('{')
	first := true
	for _, f := range fs {
		fv, ok := fieldByIndex(v, f.index)
		if !ok || (f.omitEmpty && isEmpty(fv)) || (f.omitZero && isZero(fv)) {
			continue
		}
		start := e.buf.Len()
		if err := e.value(fv); err != nil {
			return err
		}
		val := slices.Clone(e.buf.Bytes()[start:])
		e.buf.Truncate(start)
		for _, key := range []string{f.name, f.was} {
			if key == "" {
				continue
			}
			if !first {
				e.buf.WriteByte(',')
			}
			first = false
			_ = e.leaf(reflect.ValueOf(key))
			e.buf.WriteByte(':')
			e.buf.Write(val)
		}
	}
	e.buf.WriteByte('}')
	return nil
}

// fieldByIndex is v's field at index, through embedded pointers; not ok when one of them
// is nil (encoding/json leaves such fields out).
func fieldByIndex(v reflect.Value, index []int) (reflect.Value, bool) {
	for i, x := range index {
		if i > 0 && v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return reflect.Value{}, false
			}
			v = v.Elem()
		}
		v = v.Field(x)
	}
	return v, true
}

// isEmpty is encoding/json's omitempty.
func isEmpty(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Interface, reflect.Pointer:
		return v.IsZero()
	}
	return false
}

type isZeroer interface{ IsZero() bool }

// isZero is encoding/json's omitzero: the value's IsZero method when it has one.
func isZero(v reflect.Value) bool {
	if z, ok := v.Interface().(isZeroer); ok {
		if v.Kind() == reflect.Pointer && v.IsNil() {
			return true
		}
		return z.IsZero()
	}
	if v.CanAddr() {
		if z, ok := v.Addr().Interface().(isZeroer); ok {
			return z.IsZero()
		}
	}
	return v.IsZero()
}

// field is one key of a struct as encoding/json writes it.
type field struct {
	name, was           string
	index               []int
	typ                 reflect.Type
	omitEmpty, omitZero bool
}

var (
	marshalerType     = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
	cache             sync.Map // reflect.Type -> *typeInfo
	renamedCache      sync.Map // reflect.Type -> bool
)

type typeInfo struct {
	once   sync.Once
	fields []field
	err    error // what this package cannot write as encoding/json would
}

func info(t reflect.Type) *typeInfo {
	ti, _ := cache.LoadOrStore(t, &typeInfo{})
	return ti.(*typeInfo)
}

// renamed says whether a value of t can hold a field tagged was. An interface can hold
// anything; a type that writes itself (json.Marshaler, encoding.TextMarshaler) holds none.
func renamed(t reflect.Type) bool {
	if r, ok := renamedCache.Load(t); ok {
		return r.(bool)
	}
	r := renamedSeen(t, map[reflect.Type]bool{})
	renamedCache.Store(t, r)
	return r
}

func renamedSeen(t reflect.Type, seen map[reflect.Type]bool) bool {
	if seen[t] {
		return false // a type that holds itself: the first visit answers
	}
	seen[t] = true
	if t.Implements(marshalerType) || t.Implements(textMarshalerType) ||
		reflect.PointerTo(t).Implements(marshalerType) || reflect.PointerTo(t).Implements(textMarshalerType) {
		return false
	}
	switch t.Kind() {
	case reflect.Interface:
		return true
	case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Map:
		return renamedSeen(t.Elem(), seen)
	case reflect.Struct:
		for _, f := range fieldsOf(t) {
			if f.was != "" || renamedSeen(f.typ, seen) {
				return true
			}
		}
	}
	return false
}

// fieldsOf lists t's keys in encoding/json's order, embedded structs' fields in their
// place. Unlike encoding/json it does not settle two fields of one name; a test holds
// every renamed type of the project to encoding/json's output.
func fieldsOf(t reflect.Type) []field {
	ti := info(t)
	ti.once.Do(func() { ti.fields, ti.err = collect(t, nil) })
	return ti.fields
}

// collect lists t's keys; the error says what in t Marshal cannot write as encoding/json
// does, which matters only if t holds a renamed field.
func collect(t reflect.Type, at []int) ([]field, error) {
	var out []field
	var firstErr error
	for i := range t.NumField() {
		sf := t.Field(i)
		index := append(slices.Clone(at), i)
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if sf.Anonymous && name == "" {
			ft := sf.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				inner, err := collect(ft, index)
				if err == nil && !sf.IsExported() {
					err = fmt.Errorf("%w: %s embeds the unexported %s", ErrUnsupported, t, ft)
				}
				firstErr = cmp.Or(firstErr, err)
				out = append(out, inner...)
				continue
			}
		}
		if !sf.IsExported() {
			continue
		}
		if hasOpt(opts, "string") {
			firstErr = cmp.Or(firstErr, fmt.Errorf("%w: %s.%s has the \",string\" option", ErrUnsupported, t, sf.Name))
		}
		if name == "" {
			name = sf.Name
		}
		out = append(out, field{
			name: name, was: sf.Tag.Get("was"), index: index, typ: sf.Type,
			omitEmpty: hasOpt(opts, "omitempty"), omitZero: hasOpt(opts, "omitzero"),
		})
	}
	return out, firstErr
}

func hasOpt(opts, want string) bool {
	for opt := range strings.SplitSeq(opts, ",") {
		if opt == want {
			return true
		}
	}
	return false
}
