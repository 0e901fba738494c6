// Package prometheus holds the alert rules (rules.yml) and their unit tests
// (rules_test.yml); this test runs them through promtool.
package prometheus

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The rules load, and each alert fires on the series it should and only on those:
// promtool check rules, then promtool test rules. promtool comes from the
// distribution's prometheus package (CI installs it).
func TestAlertRulesWithPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("no promtool installed (apt-get install prometheus): the alert rules' checks need it; CI installs it")
	}
	for _, args := range [][]string{{"check", "rules", "rules.yml"}, {"test", "rules", "rules_test.yml"}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// The compose stack's Prometheus configuration loads, rules included: promtool check
// config, with the rules file where the configuration expects it.
func TestPrometheusConfigWithPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("no promtool installed (apt-get install prometheus): the Prometheus configuration's check needs it; CI installs it")
	}
	cfg, err := os.ReadFile("prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := filepath.Abs("rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	const inImage = "/etc/prometheus/rules.yml"
	if !strings.Contains(string(cfg), inImage) {
		t.Fatalf("prometheus.yml does not load %s", inImage)
	}
	here := filepath.Join(t.TempDir(), "prometheus.yml")
	if err := os.WriteFile(here, []byte(strings.ReplaceAll(string(cfg), inImage, rules)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "config", here).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "rules found") {
		t.Errorf("promtool check config: %v\n%s", err, out)
	}
}
