package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"
)

// The monitoring mixin: rules (promtool checks and tests them in make test), the
// PrometheusRule that wraps them, the PodMonitor and the Grafana dashboard.

func readYAML(t *testing.T, path string) obj {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v obj
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

func TestPrometheusRuleWrapsTheTestedRules(t *testing.T) {
	rules := readYAML(t, "monitoring/rules.yaml")
	pr := readYAML(t, "monitoring/prometheusrule.yaml")
	if pr["kind"] != "PrometheusRule" || !reflect.DeepEqual(get(pr, "spec", "groups"), get(rules, "groups")) {
		t.Fatal("prometheusrule.yaml's groups differ from rules.yaml, which promtool tests: regenerate it")
	}
	for _, r := range asList(get(rules, "groups", 0, "rules")) {
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if get(r, "annotations", a) == nil {
				t.Fatalf("%v has no %s", get(r, "alert"), a)
			}
		}
		url := str(get(r, "annotations", "runbook_url"))
		anchor := url[strings.LastIndex(url, "#")+1:]
		doc, _ := os.ReadFile("../docs/operations.md")
		if !strings.Contains(strings.ToLower(string(doc)), "### "+anchor) {
			t.Fatalf("%v: docs/operations.md has no runbook section ### %s", get(r, "alert"), anchor)
		}
	}
}

// dashboard is the part of Grafana's dashboard model that importing depends on.
type dashboard struct {
	Title         string `json:"title"`
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name, Type string
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Title      string `json:"title"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// TestDashboardImports: valid JSON, a schemaVersion, a data source variable and a pod
// selector that every query uses (integration tests that the metrics they name exist).
func TestDashboardImports(t *testing.T) {
	data, err := os.ReadFile("monitoring/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("dashboard.json is not valid JSON: %v", err)
	}
	if d.SchemaVersion == 0 || d.UID == "" || d.Title == "" {
		t.Fatal("a dashboard needs a schemaVersion, a uid and a title")
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" || vars["pod"] != "query" {
		t.Fatalf("want a datasource variable and a pod selector, got %v", vars)
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Fatalf("panel %q: duplicate id, a fixed data source, or no query", p.Title)
		}
		ids[p.ID] = true
		for _, q := range p.Targets {
			if !strings.Contains(q.Expr, `pod=~"$pod"`) {
				t.Fatalf("panel %q ignores the pod selector: %s", p.Title, q.Expr)
			}
		}
	}
}

func TestKustomizeWithMonitoring(t *testing.T) {
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl is not installed: cannot render deploy/kubernetes-monitoring")
	}
	out, err := exec.Command("kubectl", "kustomize", "kubernetes-monitoring").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	kinds := map[string]obj{}
	for _, d := range decodeAll(t, out) {
		kinds[str(d["kind"])] = d
	}
	if kinds["PrometheusRule"] == nil || kinds["PodMonitor"] == nil || kinds["Deployment"] == nil {
		t.Fatalf("want the sidecar overlay with a PrometheusRule and a PodMonitor, got %v", keys(kinds))
	}
	if get(kinds["ConfigMap"], "metadata", "labels", "grafana_dashboard") != "1" {
		t.Fatal("the dashboard ConfigMap needs the grafana_dashboard label")
	}
	port := get(kinds["PodMonitor"], "spec", "podMetricsEndpoints", 0, "port")
	found := false
	for _, p := range asList(get(findContainer(get(kinds["Deployment"], "spec", "template", "spec"), "confshim"), "ports")) {
		found = found || get(p, "name") == port
	}
	if !found {
		t.Fatalf("the PodMonitor scrapes port %v, which the confshim container does not have", port)
	}
}

func keys(m map[string]obj) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
