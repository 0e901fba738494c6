// Package kubernetes holds the service's Kubernetes manifests; this test checks them
// without a cluster: every document decodes, has what the cluster requires, and wires
// probes, ports, selectors and settings to what the binaries actually serve and read.
package kubernetes

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/penguinhq/dispatcher/pkg/queue"
)

type obj = map[string]any

// docs decodes every YAML document of a file, rejecting duplicate keys.
func docs(t testing.TB, path string) []obj { return decode(t, path, yaml.UnmarshalStrict) }

// decode decodes every YAML document of a file with unmarshal.
func decode(t testing.TB, path string, unmarshal func([]byte, any, ...yaml.JSONOpt) error) []obj {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []obj
	for i, part := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(raw), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(part, "")) == "" {
			continue
		}
		var o obj
		if err := unmarshal([]byte(part), &o); err != nil {
			t.Fatalf("%s, document %d: %v", filepath.Base(path), i+1, err)
		}
		out = append(out, o)
	}
	return out
}

// at walks o along keys; nil when a step is missing.
func at(o any, keys ...string) any {
	for _, k := range keys {
		m, ok := o.(obj)
		if !ok {
			return nil
		}
		o = m[k]
	}
	return o
}

func str(o any, keys ...string) string { s, _ := at(o, keys...).(string); return s }

func list(o any, keys ...string) []any { l, _ := at(o, keys...).([]any); return l }

// settings lists the environment variables a binary reads, from its -h output.
func settings(t testing.TB, bin string) map[string]bool {
	t.Helper()
	cmd := exec.Command("go", "run", "../../cmd/"+bin, "-h")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run() // -h exits non-zero
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`\[([A-Z][A-Z0-9_]+)\]`).FindAllStringSubmatch(out.String(), -1) {
		names[m[1]] = true
	}
	if !names["LOG_LEVEL"] {
		t.Fatalf("%s -h lists no LOG_LEVEL, so its settings were not read; output:\n%s", bin, &out)
	}
	return names
}

func TestManifests(t *testing.T) {
	files, _ := filepath.Glob("*.yaml")
	byKind := map[string][]obj{}
	for _, f := range files {
		for _, o := range docs(t, f) {
			if f == "nats-values.yaml" {
				continue // Helm values, not a manifest
			}
			if str(o, "apiVersion") == "" || str(o, "kind") == "" {
				t.Errorf("%s: a document without apiVersion or kind", f)
			}
			if str(o, "kind") != "Kustomization" && str(o, "metadata", "name") == "" {
				t.Errorf("%s: %s without metadata.name", f, str(o, "kind"))
			}
			byKind[str(o, "kind")] = append(byKind[str(o, "kind")], o)
		}
	}

	// The kustomization lists every manifest but the example Secret and the Helm values.
	k := byKind["Kustomization"]
	if len(k) != 1 {
		t.Fatalf("%d kustomizations, want 1", len(k))
	}
	for _, f := range files {
		listed := slices.Contains(list(k[0], "resources"), any(f))
		want := f != "kustomization.yaml" && f != "secret.example.yaml" && f != "nats-values.yaml"
		if listed != want {
			t.Errorf("kustomization lists %s: %v, want %v", f, listed, want)
		}
	}

	config := map[string]bool{}
	for _, cm := range byKind["ConfigMap"] {
		if str(cm, "metadata", "name") == "ingest-tokens" {
			continue // a file ingest reads (INGEST_TOKENS_FILE), not settings
		}
		for key := range at(cm, "data").(obj) {
			config[key] = true
		}
	}
	secretKeys := map[string]bool{}
	for _, s := range byKind["Secret"] {
		for key := range at(s, "stringData").(obj) {
			secretKeys[key] = true
		}
	}

	deployments := map[string]obj{}
	for _, d := range byKind["Deployment"] {
		name := str(d, "metadata", "name")
		deployments[name] = d
		known := settings(t, name)
		labels := at(d, "spec", "template", "metadata", "labels").(obj)
		sel := at(d, "spec", "selector", "matchLabels").(obj)
		for k, v := range sel {
			if labels[k] != v {
				t.Errorf("%s: selector %s=%v does not match the pod labels", name, k, v)
			}
		}
		for _, c := range list(d, "spec", "template", "spec", "containers") {
			ports := map[string]bool{}
			for _, p := range list(c, "ports") {
				ports[str(p, "name")] = true
			}
			for probe, path := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
				if got := str(c, probe, "httpGet", "path"); got != path {
					t.Errorf("%s: %s path %q, want %s", name, probe, got, path)
				}
				if p := str(c, probe, "httpGet", "port"); !ports[p] {
					t.Errorf("%s: %s on port %q, which the container does not name", name, probe, p)
				}
			}
			if at(c, "resources", "requests", "cpu") == nil || at(c, "resources", "requests", "memory") == nil || at(c, "resources", "limits", "memory") == nil {
				t.Errorf("%s: resources need cpu and memory requests and a memory limit", name)
			}
			for _, e := range list(c, "env") {
				if n := str(e, "name"); !known[n] {
					t.Errorf("%s: env %s is not a setting of the %s binary", name, n, name)
				}
				if key := str(e, "valueFrom", "secretKeyRef", "key"); key != "" && !secretKeys[key] {
					t.Errorf("%s: env %s reads secret key %s, which secret.example.yaml does not show", name, str(e, "name"), key)
				}
			}
			for key := range config {
				if !known[key] {
					t.Errorf("%s: the ConfigMap's %s is not a setting of the %s binary", name, key, name)
				}
			}
		}
	}
	for _, name := range []string{"ingest", "dispatcher"} {
		if deployments[name] == nil {
			t.Errorf("no %s Deployment", name)
		}
	}

	// PodDisruptionBudgets and Services select pods of a Deployment, by ports it names.
	selects := func(sel obj) obj {
		for _, d := range deployments {
			labels := at(d, "spec", "template", "metadata", "labels").(obj)
			ok := len(sel) > 0
			for k, v := range sel {
				ok = ok && labels[k] == v
			}
			if ok {
				return d
			}
		}
		return nil
	}
	for _, p := range byKind["PodDisruptionBudget"] {
		if selects(at(p, "spec", "selector", "matchLabels").(obj)) == nil {
			t.Errorf("PDB %s selects no Deployment's pods", str(p, "metadata", "name"))
		}
	}
	if len(byKind["PodDisruptionBudget"]) < 2 {
		t.Errorf("%d PodDisruptionBudgets, want one for ingest and one for the dispatcher", len(byKind["PodDisruptionBudget"]))
	}
	for _, s := range byKind["Service"] {
		d := selects(at(s, "spec", "selector").(obj))
		if d == nil {
			t.Errorf("Service %s selects no Deployment's pods", str(s, "metadata", "name"))
			continue
		}
		names := map[string]bool{}
		for _, c := range list(d, "spec", "template", "spec", "containers") {
			for _, p := range list(c, "ports") {
				names[str(p, "name")] = true
			}
		}
		for _, p := range list(s, "spec", "ports") {
			if !names[str(p, "targetPort")] {
				t.Errorf("Service %s targets port %q, which the pods do not name", str(s, "metadata", "name"), str(p, "targetPort"))
			}
		}
	}

	// The NATS Helm values ask for a 3-node JetStream cluster on persistent volumes.
	v := docs(t, "nats-values.yaml")[0]
	if at(v, "config", "cluster", "enabled") != true || at(v, "config", "cluster", "replicas") != 3.0 ||
		at(v, "config", "jetstream", "fileStore", "pvc", "enabled") != true {
		t.Errorf("nats-values.yaml does not ask for a 3-node JetStream cluster with file storage on PVCs: %v", v["config"])
	}

	// Each user of the services' account has its role's allow-list, as nats.conf does.
	seen := map[string]bool{}
	for _, u := range list(v, "config", "merge", "accounts", "DISPATCH", "users") {
		name := str(u, "user")
		seen[name] = true
		want := queue.RolePermissions(queue.Role(name))
		strs := func(path ...string) []string {
			var out []string
			for _, x := range list(u, path...) {
				out = append(out, x.(string))
			}
			return slices.Sorted(slices.Values(out))
		}
		if got := strs("permissions", "publish", "allow"); !slices.Equal(got, slices.Sorted(slices.Values(want.Publish))) {
			t.Errorf("nats-values.yaml: user %s may publish to %q, its role to %q", name, got, want.Publish)
		}
		if got := strs("permissions", "subscribe", "allow"); !slices.Equal(got, slices.Sorted(slices.Values(want.Subscribe))) {
			t.Errorf("nats-values.yaml: user %s may subscribe to %q, its role to %q", name, got, want.Subscribe)
		}
		if got := at(u, "permissions", "allow_responses") == true; got != want.Responses {
			t.Errorf("nats-values.yaml: user %s allow_responses %v, its role %v", name, got, want.Responses)
		}
		if at(u, "permissions", "publish", "deny") != nil || at(u, "permissions", "subscribe", "deny") != nil {
			t.Errorf("nats-values.yaml: user %s has a deny-list: roles are allow-lists", name)
		}
	}
	for _, r := range queue.Roles {
		if !seen[string(r)] {
			t.Errorf("nats-values.yaml has no user %s", r)
		}
	}
}

// The compose file sets only settings the binaries read: a misspelt variable would be
// silently ignored.
func TestComposeSettings(t *testing.T) {
	// Compose files override merged anchors (<<: *x) key by key: not strict.
	compose := decode(t, "../../docker-compose.yml", yaml.Unmarshal)[0]
	for name, svc := range at(compose, "services").(obj) {
		image := str(svc, "image")
		bin := image[strings.LastIndexByte(image, '/')+1 : strings.IndexByte(image, ':')]
		if bin == "natsnode" || bin == "prometheus" { // configured by their own files, not by settings
			continue
		}
		known := settings(t, bin)
		for key := range at(svc, "environment").(obj) {
			if !known[key] {
				t.Errorf("compose service %s sets %s, which %s does not read", name, key, bin)
			}
		}
	}
}

// The ConfigMap of ingest's tokens holds the lines of the shipped example file, which the
// compose stack mounts: one set of example tenants, wherever it is deployed.
func TestIngestTokensMatchTheExample(t *testing.T) {
	raw, err := os.ReadFile("../ingest-tokens.example")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for line := range strings.SplitSeq(string(raw), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			want = append(want, line)
		}
	}
	cm := decode(t, "ingest-tokens.yaml", yaml.Unmarshal)[0]
	got := strings.Split(strings.TrimSpace(str(cm, "data", "tokens")), "\n")
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Errorf("ingest-tokens.yaml holds %q, want the lines of ../ingest-tokens.example: %q", str(cm, "data", "tokens"), want)
	}
}
