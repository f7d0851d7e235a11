// Package deploy holds confshim's deployment files; these tests keep them consistent
// with each other and with confshim's defaults.
package deploy

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"
)

// confshim's defaults (contract §3).
const (
	defaultListen   = ":9280"
	defaultMetrics  = ":9281"
	defaultUpstream = "http://127.0.0.1:9180"
)

type obj = map[string]any

func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(obj)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func str(v any) string { return fmt.Sprint(v) }

func decodeAll(t *testing.T, data []byte) []obj {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []obj
	for {
		var d obj
		err := dec.Decode(&d)
		if err == io.EOF {
			return docs
		}
		if err != nil {
			t.Fatal(err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// checkStateVolume: the confshim-state volume is a pod-lifetime tmpfs (it holds secrets).
func checkStateVolume(t *testing.T, volumes any) {
	t.Helper()
	for _, v := range asList(volumes) {
		if get(v, "name") == "confshim-state" {
			if get(v, "emptyDir", "medium") != "Memory" {
				t.Fatalf("confshim-state must be an in-memory emptyDir: %v", v)
			}
			return
		}
	}
	t.Fatal("no confshim-state volume")
}

func findContainer(spec any, name string) obj {
	containers, _ := get(spec, "containers").([]any)
	for _, c := range containers {
		if get(c, "name") == name {
			return c.(obj)
		}
	}
	return nil
}

// checkSidecar checks a confshim container: ports, probes, security, resources, args.
func checkSidecar(t *testing.T, c obj) {
	t.Helper()
	if c == nil {
		t.Fatal("no confshim container")
	}
	ports := map[string]string{}
	for _, p := range get(c, "ports").([]any) {
		ports[str(get(p, "name"))] = str(get(p, "containerPort"))
	}
	if ports["confshim"] != "9280" || ports["confshim-metrics"] != "9281" {
		t.Fatalf("ports %v, want confshim 9280 and confshim-metrics 9281 (the defaults)", ports)
	}
	if get(c, "readinessProbe", "httpGet", "path") != "/readyz" || get(c, "readinessProbe", "httpGet", "port") != "confshim-metrics" {
		t.Fatalf("readiness probe: %v", get(c, "readinessProbe"))
	}
	if get(c, "livenessProbe", "httpGet", "path") != "/healthz" || get(c, "livenessProbe", "httpGet", "port") != "confshim-metrics" {
		t.Fatalf("liveness probe: %v", get(c, "livenessProbe"))
	}
	sc := get(c, "securityContext")
	if get(sc, "readOnlyRootFilesystem") != true || get(sc, "runAsNonRoot") != true || get(sc, "allowPrivilegeEscalation") != false {
		t.Fatalf("security context: %v", sc)
	}
	if get(c, "resources", "requests", "memory") == nil || get(c, "resources", "limits", "memory") == nil {
		t.Fatalf("resources: %v", get(c, "resources"))
	}
	args := fmt.Sprint(get(c, "args"))
	mounted := false
	for _, m := range asList(get(c, "volumeMounts")) {
		mounted = mounted || (get(m, "name") == "confshim-state" && get(m, "mountPath") == "/var/lib/confshim")
	}
	if !mounted || !strings.Contains(args, "--state-dir=/var/lib/confshim") {
		t.Fatalf("re-seeding after a confshim restart needs --state-dir on the confshim-state volume: args %s", args)
	}
	for _, want := range []string{"--listen=" + defaultListen, "--upstream=" + defaultUpstream, "--metrics-listen=" + defaultMetrics} {
		if !strings.Contains(args, want) {
			t.Fatalf("args %s lack %s", args, want)
		}
	}
}

// The first start and a restart (docs/operations.md, "First start and restarts").
const (
	// reseedTarget: confshim re-seeds a restarted APISIX within 2 s of its Admin API
	// answering again (contract §8.4).
	reseedTarget = 2
	// apisixStartAllowance: what this check allows APISIX from its container's start to
	// an answering Admin API (nginx and its workers; a few seconds).
	apisixStartAllowance = 5
)

// checkAdminServiceReachesNotReadyPods: apache/apisix-helm-chart#847. A new APISIX in
// API-driven standalone mode is not Ready until its first configuration; the controller
// must reach it through the admin Service all the same.
func checkAdminServiceReachesNotReadyPods(t *testing.T, svc obj) {
	t.Helper()
	if get(svc, "spec", "publishNotReadyAddresses") != true {
		t.Fatalf("the admin Service must publish not-ready addresses, or the first start deadlocks (apache/apisix-helm-chart#847): %v", get(svc, "spec"))
	}
}

func TestKustomizeOverlay(t *testing.T) {
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl is not installed: cannot render deploy/kubernetes")
	}
	out, err := exec.Command("kubectl", "kustomize", "kubernetes").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	checkOverlay(t, out)
}

// post-render.sh is what a real install runs: the chart's rendering on stdin, the
// overlay's result on stdout.
func TestPostRenderer(t *testing.T) {
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl is not installed: cannot render deploy/kubernetes")
	}
	rendered, err := os.Open("kubernetes/apisix-rendered.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer rendered.Close()
	cmd := exec.Command("bash", "kubernetes/post-render.sh")
	cmd.Stdin = rendered
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("post-render.sh: %v\n%s", err, stderr.Bytes())
	}
	checkOverlay(t, out)
}

func checkOverlay(t *testing.T, out []byte) {
	t.Helper()
	var deployment, adminSvc, gatewaySvc obj
	for _, d := range decodeAll(t, out) {
		switch {
		case d["kind"] == "Deployment" && get(d, "metadata", "name") == "apisix":
			deployment = d
		case d["kind"] == "Service" && get(d, "metadata", "name") == "apisix-admin":
			adminSvc = d
		case d["kind"] == "Service" && get(d, "metadata", "name") == "apisix-gateway":
			gatewaySvc = d
		}
	}
	if deployment == nil || adminSvc == nil {
		t.Fatal("the overlay must render the apisix Deployment and the apisix-admin Service")
	}
	spec := get(deployment, "spec", "template", "spec")
	checkSidecar(t, findContainer(spec, "confshim"))
	checkStateVolume(t, get(spec, "volumes"))
	apisix := findContainer(spec, "apisix")
	if apisix == nil {
		t.Fatal("the APISIX container must stay")
	}
	port := get(adminSvc, "spec", "ports", 0)
	if get(port, "targetPort") != "confshim" || get(port, "name") != "apisix-admin" || str(get(port, "port")) != "9180" {
		t.Fatalf("the admin Service must keep its port name and number and target confshim: %v", port)
	}
	checkAdminServiceReachesNotReadyPods(t, adminSvc)
	// only the admin door skips readiness: traffic never goes to an APISIX holding nothing
	if gatewaySvc == nil || get(gatewaySvc, "spec", "publishNotReadyAddresses") == true {
		t.Fatalf("the gateway Service must keep honouring readiness: %v", gatewaySvc)
	}

	// A restarted APISIX container is not Ready until its readiness probe passes; confshim,
	// in the same pod and with its kept configuration on the pod's volume (checkSidecar,
	// checkStateVolume), re-seeds it before that first probe, so the probe finds the
	// configuration back instead of failing until the controller's next sync.
	probe := get(apisix, "readinessProbe")
	if get(probe, "httpGet", "path") != "/status/ready" {
		t.Fatalf("the APISIX container keeps the chart's readiness probe: %v", probe)
	}
	delay, _ := get(probe, "initialDelaySeconds").(int)
	if delay < apisixStartAllowance+reseedTarget {
		t.Fatalf("APISIX's first readiness probe after a restart comes %d s after its start: sooner than its start-up (%d s allowed) plus confshim's re-seed (%d s)",
			delay, apisixStartAllowance, reseedTarget)
	}
}

func TestHelmValuesSnippet(t *testing.T) {
	data, err := os.ReadFile("helm/values-confshim.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values obj
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	checkSidecar(t, get(values, "extraContainers", 0).(obj))
	checkStateVolume(t, get(values, "extraVolumes"))
	if get(values, "apisix", "admin", "ip") != "127.0.0.1" || str(get(values, "apisix", "admin", "port")) != "9180" {
		t.Fatal("APISIX's Admin API must listen on loopback:9180, where confshim's --upstream points")
	}
	if get(values, "apisix", "deployment", "role_traditional", "config_provider") != "yaml" {
		t.Fatal("API-driven standalone needs config_provider: yaml")
	}
	shim := str(get(values, "extraDeploy", 0))
	if !strings.Contains(shim, "targetPort: confshim") || str(get(values, "ingress-controller", "apisix", "adminService", "port")) != "9280" {
		t.Fatal("the controller must be pointed at confshim's port")
	}
	// extraDeploy is a template (tpl); its spec is plain YAML below the first line with
	// a template action, so the Service is checked as Kubernetes will read it.
	var svc obj
	if err := yaml.Unmarshal([]byte(untemplated(shim)), &svc); err != nil {
		t.Fatalf("extraDeploy's Service: %v", err)
	}
	checkAdminServiceReachesNotReadyPods(t, svc)
}

// untemplated drops the lines of a Helm template that hold template actions (the
// values' Service names and selector come from the chart's helpers).
func untemplated(tpl string) string {
	var kept []string
	for _, line := range strings.Split(tpl, "\n") {
		if !strings.Contains(line, "{{") {
			kept = append(kept, line)
		}
	}
	return strings.Join(kept, "\n")
}

func TestComposeAgreesWithDefaults(t *testing.T) {
	data, err := os.ReadFile("compose/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var compose obj
	if err := yaml.Unmarshal(data, &compose); err != nil {
		t.Fatal(err)
	}
	cs := get(compose, "services", "confshim")
	if get(cs, "network_mode") != "service:apisix" {
		t.Fatal("confshim must share APISIX's network namespace to reach its loopback Admin API")
	}
	env := get(cs, "environment")
	if get(env, "CONFSHIM_STATE_DIR") != "/var/lib/confshim" || !strings.Contains(fmt.Sprint(get(cs, "volumes")), "confshim-state:/var/lib/confshim") {
		t.Fatalf("re-seeding after a confshim restart needs CONFSHIM_STATE_DIR on a volume: %v", cs)
	}
	if get(env, "CONFSHIM_LISTEN") != defaultListen || get(env, "CONFSHIM_METRICS_LISTEN") != defaultMetrics || get(env, "CONFSHIM_UPSTREAM") != defaultUpstream {
		t.Fatalf("confshim environment %v disagrees with the defaults", env)
	}
	published := fmt.Sprint(get(compose, "services", "apisix", "ports"))
	for _, p := range []string{"9280:9280", "9281:9281"} {
		if !strings.Contains(published, p) {
			t.Fatalf("the apisix service must publish confshim's %s: %s", p, published)
		}
	}
	if strings.Contains(published, "9180") {
		t.Fatal("APISIX's own Admin API must not be published: confshim is the only door")
	}

	conf, err := os.ReadFile("compose/apisix/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var apisix obj
	if err := yaml.Unmarshal(conf, &apisix); err != nil {
		t.Fatal(err)
	}
	listen := get(apisix, "deployment", "admin", "admin_listen")
	if upstream := fmt.Sprintf("http://%s:%s", str(get(listen, "ip")), str(get(listen, "port"))); upstream != defaultUpstream {
		t.Fatalf("APISIX's admin_listen %s is not confshim's upstream %s", upstream, defaultUpstream)
	}
	if get(apisix, "deployment", "role") != "traditional" || get(apisix, "deployment", "role_traditional", "config_provider") != "yaml" {
		t.Fatal("API-driven standalone: role traditional, config_provider yaml")
	}
}
