package openapi_test

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	"github.com/pb33f/libopenapi/datamodel/high/base"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/httpapi"
	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/jsonkeys"
	"github.com/penguinhq/dispatcher/pkg/openapi"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// TestSchemaFields holds component schemas to the Go types the APIs encode: a schema's
// properties must be the JSON fields the type can have (every field set), and its
// required ones those the type always has (the zero value's, which omitempty and
// omitzero leave out). A field added to a type fails here until the document has it. A
// field renamed (a was tag) is written under both keys for a version: the document has
// both, and marks the old one deprecated.
func TestSchemaFields(t *testing.T) {
	t.Parallel()
	for _, c := range schemaTypes() {
		t.Run(c.schema+"/"+reflect.TypeOf(c.value).String(), func(t *testing.T) {
			t.Parallel()
			props, required, deprecated := schemaFields(t, c.doc, c.schema)
			full := reflect.New(reflect.TypeOf(c.value)).Elem()
			fill(full)
			fields, always := jsonKeys(t, full.Interface()), jsonKeys(t, c.value)
			for _, f := range fields {
				if !slices.Contains(props, f) {
					t.Errorf("the type has field %q; the schema does not", f)
				}
			}
			for _, p := range props {
				if !slices.Contains(fields, p) {
					t.Errorf("the schema has property %q; the type does not", p)
				}
			}
			slices.Sort(required)
			if !slices.Equal(required, always) {
				t.Errorf("the schema requires %q; the type always has %q", required, always)
			}
			if old := oldKeys(reflect.TypeOf(c.value)); !slices.Equal(deprecated, old) {
				t.Errorf("the schema marks %q deprecated; the type's old keys are %q", deprecated, old)
			}
		})
	}
}

// schemaTypes are the component schemas of the documents and the Go types they describe.
func schemaTypes() []schemaType {
	return []schemaType{
		{openapi.Ingest(), "Problem", httpapi.Problem{}},
		{openapi.Ingest(), "Status", request.Status{}},
		{openapi.Ingest(), "Attempt", request.AttemptInfo{}},
		{openapi.Ingest(), "StatusDeadLetter", request.DeadInfo{}},
		{openapi.Ingest(), "QueuePlace", request.QueuePlace{}},
		{openapi.Admin(), "Problem", httpapi.Problem{}},
		{openapi.Admin(), "ClientsPage", admin.ClientsPage{}},
		{openapi.Admin(), "Client", admin.Client{}},
		{openapi.Admin(), "Steering", request.Steering{}},
		{openapi.Admin(), "DeadLetter", request.DeadLetter{}},
		{openapi.Admin(), "DeadLetterBody", admin.DeadLetterBody{}},
		{openapi.Admin(), "DeadLettersPage", admin.DeadLettersPage[request.DeadLetter]{}},
		{openapi.Admin(), "ReplayItem", admin.ReplayItem{}},
		{openapi.Admin(), "ReplayReport", admin.ReplayReport{}},
		{openapi.Admin(), "Steered", admin.Steered{}},
		{openapi.Admin(), "ClientSteering", admin.ClientSteering{}},
		{openapi.Admin(), "PurgeResult", admin.PurgeResult{}},
		{openapi.Admin(), "Status", admin.Status{}},
		{openapi.Admin(), "QueueSummary", admin.QueueSummary{}},
		{openapi.Admin(), "LeaseStatus", queue.LeaseStatus{}},
		{openapi.Admin(), "InstanceStatus", queue.InstanceStatus{}},
		{openapi.Admin(), "PartitionLease", queue.PartitionLease{}},
		{openapi.Admin(), "ClusterStatus", queue.ClusterStatus{}},
		{openapi.Admin(), "GroupStatus", queue.GroupStatus{}},
		{openapi.Admin(), "ReplicaStatus", queue.ReplicaStatus{}},
		{openapi.Admin(), "StreamStatus", queue.StreamStatus{}},
		{openapi.Admin(), "Budget", request.Budget{}},
		{openapi.Admin(), "BudgetView", admin.BudgetView{}},
		{openapi.Admin(), "InstanceBudget", admin.InstanceBudget{}},
		{openapi.Admin(), "RequestState", admin.RequestState{}},
		{openapi.Admin(), "CancelOutcome", admin.CancelOutcome{}},
		{openapi.Admin(), "LaneInfo", schedule.LaneInfo{}},
		{openapi.Admin(), "Delivery", introspect.Delivery{}},
		{openapi.Admin(), "RequestRecord", request.Status{}},
		{openapi.Admin(), "RecordAttempt", request.AttemptInfo{}},
		{openapi.Admin(), "RecordDeadLetter", request.DeadInfo{}},
		{openapi.Admin(), "QueuePlace", request.QueuePlace{}},
	}
}

type schemaType struct {
	doc    []byte
	schema string
	value  any
}

// Every type the APIs and the dispatchers' questions write with a renamed field is what
// encoding/json writes, once the old keys (jsonkeys) are taken out, at every depth.
func TestRenamedTypesAreEncodingJSONBesideTheirOldKeys(t *testing.T) {
	t.Parallel()
	values := []any{introspect.LanesAnswer{}, introspect.DeliveredAnswer{}, introspect.HistoryAnswer{},
		introspect.BudgetAnswer{}, introspect.ActivityAnswer{}, admin.Overview{}, admin.ClientView{}, request.Steering{}}
	for _, c := range schemaTypes() {
		values = append(values, c.value)
	}
	old := map[string]bool{}
	for _, v := range values {
		collectOld(reflect.TypeOf(v), old, map[reflect.Type]bool{})
	}
	for _, v := range values {
		full := reflect.New(reflect.TypeOf(v))
		fill(full.Elem())
		for _, x := range []any{full.Interface(), v} { // every field set, and none
			got, err := jsonkeys.Marshal(x)
			if err != nil {
				t.Errorf("%T: %v", v, err)
				continue
			}
			want, _ := json.Marshal(x)
			var gotTree, wantTree any
			if json.Unmarshal(got, &gotTree) != nil || json.Unmarshal(want, &wantTree) != nil {
				t.Fatalf("%T: not JSON: %s", v, got)
			}
			if !reflect.DeepEqual(without(gotTree, old), wantTree) {
				t.Errorf("%T without its old keys:\n%s\nencoding/json:\n%s", v, got, want)
			}
		}
	}
}

// collectOld adds the old keys of t's fields, at every depth, to old.
func collectOld(t reflect.Type, old map[string]bool, seen map[reflect.Type]bool) {
	if seen[t] {
		return
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Map:
		collectOld(t.Elem(), old, seen)
	case reflect.Struct:
		for i := range t.NumField() {
			if was := t.Field(i).Tag.Get("was"); was != "" {
				old[was] = true
			}
			collectOld(t.Field(i).Type, old, seen)
		}
	}
}

// without is tree with the keys in old taken out of every object.
func without(tree any, old map[string]bool) any {
	switch v := tree.(type) {
	case map[string]any:
		for k := range v {
			if old[k] {
				delete(v, k)
			} else {
				v[k] = without(v[k], old)
			}
		}
	case []any:
		for i := range v {
			v[i] = without(v[i], old)
		}
	}
	return tree
}

// schemaFields returns the properties of a component schema, its allOf's included, and
// those it requires.
func schemaFields(t *testing.T, doc []byte, name string) (props, required, deprecated []string) {
	t.Helper()
	d, err := libopenapi.NewDocument(doc)
	if err != nil {
		t.Fatal(err)
	}
	m, err := d.BuildV3Model()
	if err != nil {
		t.Fatal(err)
	}
	proxy, ok := m.Model.Components.Schemas.Get(name)
	if !ok {
		t.Fatalf("no component schema %s", name)
	}
	var collect func(s *base.Schema)
	collect = func(s *base.Schema) {
		if s.Properties != nil {
			for name, p := range s.Properties.FromOldest() {
				props = append(props, name)
				if d := p.Schema().Deprecated; d != nil && *d {
					deprecated = append(deprecated, name)
				}
			}
		}
		required = append(required, s.Required...)
		for _, p := range s.AllOf {
			collect(p.Schema())
		}
	}
	collect(proxy.Schema())
	slices.Sort(props)
	slices.Sort(deprecated)
	return slices.Compact(props), slices.Compact(required), slices.Compact(deprecated)
}

// oldKeys are the keys t's fields are also written under for a version (their was tags),
// its embedded structs' included, sorted.
func oldKeys(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if was := f.Tag.Get("was"); was != "" {
			out = append(out, was)
		}
		if f.Anonymous && f.Type.Kind() == reflect.Struct && f.Tag.Get("json") == "" {
			out = append(out, oldKeys(f.Type)...)
		}
	}
	slices.Sort(out)
	return out
}

// jsonKeys returns the top-level keys of v as the APIs write it, sorted.
func jsonKeys(t *testing.T, v any) []string {
	t.Helper()
	b, err := jsonkeys.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return slices.Sorted(maps.Keys(m))
}

// fill sets every exported field of v, at every depth, to a value that is not zero.
func fill(v reflect.Value) {
	if v.Type() == reflect.TypeFor[time.Time]() {
		v.Set(reflect.ValueOf(time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)))
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Field(i).CanSet() {
				fill(v.Field(i))
			}
		}
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(p.Elem())
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0))
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k)
		fill(e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	}
}
