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
	"github.com/penguinhq/dispatcher/pkg/openapi"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// TestSchemaFields holds component schemas to the Go types the APIs encode: a schema's
// properties must be the JSON fields the type can have (every field set), and its
// required ones those the type always has (the zero value's, which omitempty and
// omitzero leave out). A field added to a type fails here until the document has it.
func TestSchemaFields(t *testing.T) {
	t.Parallel()
	for _, c := range schemaTypes() {
		t.Run(c.schema+"/"+reflect.TypeOf(c.value).String(), func(t *testing.T) {
			t.Parallel()
			props, required := schemaFields(t, c.doc, c.schema)
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

// schemaFields returns the properties of a component schema, its allOf's included, and
// those it requires.
func schemaFields(t *testing.T, doc []byte, name string) (props, required []string) {
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
			for name := range s.Properties.KeysFromOldest() {
				props = append(props, name)
			}
		}
		required = append(required, s.Required...)
		for _, p := range s.AllOf {
			collect(p.Schema())
		}
	}
	collect(proxy.Schema())
	slices.Sort(props)
	return slices.Compact(props), slices.Compact(required)
}

// jsonKeys returns the top-level keys of v as the APIs write it, sorted.
func jsonKeys(t *testing.T, v any) []string {
	t.Helper()
	b, err := json.Marshal(v)
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
