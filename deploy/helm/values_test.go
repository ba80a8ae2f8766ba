package helm_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// defaultExternal is the Secrets the default values expect the operator to
// create.
var defaultExternal = []string{"aenv-database", "aenv-secrets-key"}

// TestChartValues lints and renders the chart with its defaults and with
// value sets that turn on each of its options, and checks what each one
// promises.
func TestChartValues(t *testing.T) {
	h := newHelm(t)
	tests := []struct {
		name     string
		values   string
		external []string // Secrets the operator creates
		check    func(r *rendered) error
	}{
		{"defaults", "", defaultExternal, func(r *rendered) error {
			node, gw := r.node().Spec.Template.Spec, r.gateway().Spec.Template.Spec
			return errors.Join(
				secretRef(node, "AENV_DATABASE_URL", "aenv-database", "url"),
				secretRef(gw, "AENV_DATABASE_URL", "aenv-database", "url"),
				want(secretVolume(node, "secrets-key") == "aenv-secrets-key", "node's secrets key volume is %q", secretVolume(node, "secrets-key")),
				want(len(all[corev1.Secret](r)) == 0, "Secrets rendered by default: %d", len(all[corev1.Secret](r))),
				want(len(all[networkingv1.Ingress](r)) == 0, "an Ingress by default"),
				want(len(all[serviceMonitor](r)) == 0, "a ServiceMonitor by default"),
				want(*r.gateway().Spec.Replicas == 2, "gateway replicas %d", *r.gateway().Spec.Replicas),
				want(container(gw).Image == "ghcr.io/aenv-dev/aenv:latest", "image %s", container(gw).Image),
				want(env(node, "AENV_METRICS_LISTEN") == nil, "node metrics listener open by default"),
			)
		}},
		{"image, scheduling and resources", `
image: {repository: registry.example.com/aenv, tag: v1.2.3, pullPolicy: Always}
imagePullSecrets: [{name: regcred}]
node:
  nodeSelector: {aenv.dev/node: null, pool: sandboxes} # null drops the default label
  tolerations: [{key: aenv.dev/node, operator: Equal, value: "true", effect: NoSchedule}]
  resources: {requests: {cpu: "2", memory: 4Gi}, limits: {memory: 64Gi}}
  port: 9000
  dataDir: /srv/aenv
  maxSandboxes: 50
  extraEnv: [{name: AENV_PLATFORM, value: kvm}]
gateway:
  replicas: 5
  nodeSelector: {pool: system}
  resources: {requests: {cpu: 250m}}
  podDisruptionBudget: {enabled: false}
config: {AENV_WARM_SANDBOXES: 4, AENV_IMAGE_CACHE_MB: 20000000, AENV_PLATFORM: systrap, AENV_KILL_ON_EXIT: true}
`, defaultExternal, func(r *rendered) error {
			node, gw := r.node().Spec.Template.Spec, r.gateway().Spec.Template.Spec
			cfg := get[corev1.ConfigMap](r, "ConfigMap", "aenv-config")
			nc := container(node)
			return errors.Join(
				want(nc.Image == "registry.example.com/aenv:v1.2.3" && nc.ImagePullPolicy == corev1.PullAlways, "node image %s %s", nc.Image, nc.ImagePullPolicy),
				want(len(node.ImagePullSecrets) == 1 && node.ImagePullSecrets[0].Name == "regcred", "pull secrets %v", node.ImagePullSecrets),
				want(reflect.DeepEqual(node.NodeSelector, map[string]string{"pool": "sandboxes"}), "node selector %v", node.NodeSelector),
				want(len(node.Tolerations) == 1 && node.Tolerations[0].Effect == corev1.TaintEffectNoSchedule, "tolerations %v", node.Tolerations),
				want(nc.Resources.Limits.Memory().Equal(resource.MustParse("64Gi")), "node memory limit %v", nc.Resources.Limits),
				envValue(node, "AENV_LISTEN", ":9000"),
				envValue(node, "AENV_ADVERTISE", "$(HOST_IP):9000"),
				envValue(node, "AENV_DATA_DIR", "/srv/aenv"),
				envValue(node, "AENV_PLATFORM", "kvm"),
				want(nc.Ports[0].HostPort == 9000, "host port %d", nc.Ports[0].HostPort),
				want(node.Volumes[0].HostPath != nil && node.Volumes[0].HostPath.Path == "/srv/aenv", "data volume %+v", node.Volumes[0]),
				want(*r.gateway().Spec.Replicas == 5, "gateway replicas %d", *r.gateway().Spec.Replicas),
				want(reflect.DeepEqual(gw.NodeSelector, map[string]string{"pool": "system"}), "gateway node selector %v", gw.NodeSelector),
				want(r.objects["PodDisruptionBudget/aenv-gateway"] == nil, "PodDisruptionBudget rendered though disabled"),
				want(cfg.Data["AENV_MAX_SANDBOXES"] == "50" && cfg.Data["AENV_WARM_SANDBOXES"] == "4" &&
					cfg.Data["AENV_IMAGE_CACHE_MB"] == "20000000" && cfg.Data["AENV_PLATFORM"] == "systrap" && cfg.Data["AENV_KILL_ON_EXIT"] == "true",
					"config %v", cfg.Data),
			)
		}},
		{"secrets created by the chart", `
database: {url: "postgres://aenv:pw@db:5432/aenv"}
secretsKey: {key: c2VjcmV0LWtleS1zZWNyZXQta2V5LXNlY3JldC1rZXkhIQ==}
`, nil, func(r *rendered) error {
			db := get[corev1.Secret](r, "Secret", "aenv-database")
			key := get[corev1.Secret](r, "Secret", "aenv-secrets-key")
			if db == nil || key == nil {
				return errors.New("Secrets aenv-database and aenv-secrets-key not rendered")
			}
			return errors.Join(
				want(db.StringData["url"] == "postgres://aenv:pw@db:5432/aenv", "database url %q", db.StringData["url"]),
				want(key.StringData["key"] != "", "no key"),
				secretRef(r.gateway().Spec.Template.Spec, "AENV_DATABASE_URL", "aenv-database", "url"),
			)
		}},
		{"existing secrets", `
database: {existingSecret: pg-credentials, secretKey: dsn}
secretsKey: {existingSecret: aenv-master-key, secretKey: master.key}
apiKey: {existingSecret: clients, secretKey: token}
`, []string{"pg-credentials", "aenv-master-key"}, func(r *rendered) error {
			node, gw := r.node().Spec.Template.Spec, r.gateway().Spec.Template.Spec
			return errors.Join(
				want(len(all[corev1.Secret](r)) == 0, "Secrets rendered: %d", len(all[corev1.Secret](r))),
				secretRef(node, "AENV_DATABASE_URL", "pg-credentials", "dsn"),
				secretRef(gw, "AENV_DATABASE_URL", "pg-credentials", "dsn"),
				secretRef(gw, "AENV_API_KEY", "clients", "token"),
				envValue(node, "AENV_SECRETS_KEY_FILE", "/etc/aenv/secrets-key/master.key"),
				envValue(gw, "AENV_SECRETS_KEY_FILE", "/etc/aenv/secrets-key/master.key"),
				want(secretVolume(gw, "secrets-key") == "aenv-master-key", "gateway's secrets key volume is %q", secretVolume(gw, "secrets-key")),
			)
		}},
		{"TLS ingress", `
domain: sandboxes.example.org
ingress:
  enabled: true
  className: nginx
  host: api.sandboxes.example.org
  annotations: {nginx.ingress.kubernetes.io/proxy-read-timeout: "3600"}
  tls: {enabled: true, secretName: aenv-tls}
`, defaultExternal, func(r *rendered) error {
			in := get[networkingv1.Ingress](r, "Ingress", "aenv-gateway")
			if in == nil {
				return errors.New("no Ingress aenv-gateway")
			}
			hosts := []string{"api.sandboxes.example.org", "*.sandboxes.example.org"}
			var ruleHosts []string
			for _, rule := range in.Spec.Rules {
				ruleHosts = append(ruleHosts, rule.Host)
			}
			return errors.Join(
				want(in.Spec.IngressClassName != nil && *in.Spec.IngressClassName == "nginx", "class %v", in.Spec.IngressClassName),
				want(slices.Equal(ruleHosts, hosts), "rule hosts %v, want %v", ruleHosts, hosts),
				want(len(in.Spec.TLS) == 1 && in.Spec.TLS[0].SecretName == "aenv-tls" && slices.Equal(in.Spec.TLS[0].Hosts, hosts),
					"tls %+v, want %v in aenv-tls", in.Spec.TLS, hosts),
				want(in.Annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "3600", "annotations %v", in.Annotations),
				want(get[corev1.ConfigMap](r, "ConfigMap", "aenv-config").Data["AENV_DOMAIN"] == "sandboxes.example.org", "AENV_DOMAIN not the domain"),
			)
		}},
		{"plain ingress on the domain", `ingress: {enabled: true}`, defaultExternal, func(r *rendered) error {
			in := get[networkingv1.Ingress](r, "Ingress", "aenv-gateway")
			if in == nil {
				return errors.New("no Ingress aenv-gateway")
			}
			return want(len(in.Spec.TLS) == 0 && len(in.Spec.Rules) == 2 && in.Spec.Rules[0].Host == "aenv.example.com" &&
				in.Spec.Rules[1].Host == "*.aenv.example.com", "ingress %+v", in.Spec)
		}},
		{"object store", `
objectStore:
  enabled: true
  bucket: aenv-templates
  prefix: prod
  endpoint: http://minio.storage:9000
  region: eu-west-1
  credentialsSecret: aenv-s3
`, append([]string{"aenv-s3"}, defaultExternal...), func(r *rendered) error {
			cfg := get[corev1.ConfigMap](r, "ConfigMap", "aenv-config").Data
			node := r.node().Spec.Template.Spec
			return errors.Join(
				want(cfg["AENV_OBJECT_STORE"] == "s3://aenv-templates/prod", "AENV_OBJECT_STORE %q", cfg["AENV_OBJECT_STORE"]),
				want(cfg["AENV_OBJECT_STORE_ENDPOINT"] == "http://minio.storage:9000", "endpoint %q", cfg["AENV_OBJECT_STORE_ENDPOINT"]),
				want(cfg["AENV_OBJECT_STORE_REGION"] == "eu-west-1", "region %q", cfg["AENV_OBJECT_STORE_REGION"]),
				secretRef(node, "AWS_ACCESS_KEY_ID", "aenv-s3", "AWS_ACCESS_KEY_ID"),
				secretRef(node, "AWS_SECRET_ACCESS_KEY", "aenv-s3", "AWS_SECRET_ACCESS_KEY"),
			)
		}},
		{"object store without a prefix", `objectStore: {enabled: true, bucket: b}`, defaultExternal, func(r *rendered) error {
			cfg := get[corev1.ConfigMap](r, "ConfigMap", "aenv-config").Data
			return errors.Join(
				want(cfg["AENV_OBJECT_STORE"] == "s3://b", "AENV_OBJECT_STORE %q", cfg["AENV_OBJECT_STORE"]),
				want(env(r.node().Spec.Template.Spec, "AWS_ACCESS_KEY_ID") == nil, "credentials without a credentials Secret"),
			)
		}},
		{"service monitor", `serviceMonitor: {enabled: true, labels: {release: prometheus}}`, defaultExternal, func(r *rendered) error {
			m := get[serviceMonitor](r, "ServiceMonitor", "aenv")
			if m == nil {
				return errors.New("no ServiceMonitor aenv")
			}
			node := r.node().Spec.Template.Spec
			return errors.Join(
				want(m.Labels["release"] == "prometheus", "labels %v", m.Labels),
				envValue(node, "AENV_METRICS_LISTEN", ":9464"),
				want(get[corev1.Service](r, "Service", "aenv-node-metrics") != nil, "no Service aenv-node-metrics"),
				want(len(m.Spec.Endpoints) == 2 && m.Spec.Endpoints[1].Authorization != nil &&
					m.Spec.Endpoints[1].Authorization.Credentials.Name == "aenv-api-key", "endpoints %+v", m.Spec.Endpoints),
			)
		}},
		{"other names", `fullnameOverride: sandbox`, defaultExternal, func(r *rendered) error {
			var errs []error
			for _, key := range []string{"DaemonSet/sandbox-node", "Deployment/sandbox-gateway", "ConfigMap/sandbox-config", "Service/sandbox-gateway"} {
				errs = append(errs, want(r.objects[key] != nil, "%s not rendered", key))
			}
			return errors.Join(errs...)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := h.render(chartDir, tt.values)
			if err != nil {
				t.Fatal(err)
			}
			if err := consistent(r, tt.external); err != nil {
				t.Error(err)
			}
			if err := tt.check(r); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestChartMistakesFail shows that the checks above catch mistakes in the
// values and in the chart's templates: each case changes a copy of the chart
// or gives bad values, and must fail with the error named.
func TestChartMistakesFail(t *testing.T) {
	h := newHelm(t)
	tests := []struct {
		name     string
		file     string // a file of the chart to change, "" for none
		old, new string
		values   string
		wantErr  string
	}{
		{name: "misspelled field in a template", file: "templates/node.yaml",
			old: "hostNetwork: true", new: "hostNetwrok: true", wantErr: "unknown field"},
		{name: "field in the wrong case in a template", file: "templates/node.yaml",
			old: "hostPID: true", new: "hostpid: true", wantErr: "mind the case"},
		{name: "field at the wrong level in a template", file: "templates/gateway.yaml",
			old: "      automountServiceAccountToken: false", new: "      automountServiceAccountToken: false\n      imagePullPolicy: Always", wantErr: "unknown field"},
		{name: "wrong value type in a template", file: "templates/gateway.yaml",
			old: "replicas: {{ .Values.gateway.replicas | int64 }}", new: "replicas: {{ .Values.gateway.replicas | quote }}", wantErr: "cannot unmarshal string"},
		{name: "bad indentation in a template", file: "templates/gateway.yaml",
			old: "{{- toYaml . | nindent 12 }}\n          {{- end }}\n          volumeMounts:", new: "{{- toYaml . | nindent 10 }}\n          {{- end }}\n          volumeMounts:", wantErr: "unknown field"},
		{name: "key given twice in a template", file: "templates/node.yaml",
			old: "      hostPID: true", new: "      hostPID: true\n      hostPID: false", wantErr: "already set"},
		{name: "unknown helper in a template", file: "templates/node.yaml",
			old: `{{ include "aenv.fullname" . }}-node`, new: `{{ include "aenv.fulname" . }}-node`, wantErr: "no template"},
		{name: "template syntax", file: "templates/config.yaml",
			old: "{{ .Values.domain | quote }}", new: "{{ .Values.domain | quote }", wantErr: "helm lint"},
		{name: "secret read and not rendered", file: "templates/gateway.yaml",
			old: "secretName: {{ include \"aenv.secretsKeySecret\" . }}", new: "secretName: aenv-other-key", wantErr: "neither rendered nor created"},
		{name: "wrong value type", values: `gateway: {replicas: "2"}`, wantErr: "want integer"},
		{name: "misspelled value", values: `gateway: {replica: 2}`, wantErr: "additional properties 'replica' not allowed"},
		{name: "misspelled top-level value", values: `ingres: {enabled: true}`, wantErr: "additional properties 'ingres' not allowed"},
		{name: "bad quantity", values: `node: {resources: {requests: {memory: 2GB}}}`, wantErr: "quantities must match"},
		{name: "unknown log format", values: `logFormat: yaml`, wantErr: "logFormat"},
		{name: "TLS without a secret", values: `ingress: {enabled: true, tls: {enabled: true}}`, wantErr: "ingress.tls.secretName must be set"},
		{name: "object store without a bucket", values: `objectStore: {enabled: true}`, wantErr: "objectStore.bucket must be set"},
		{name: "no database", values: `database: {existingSecret: ""}`, wantErr: "set database.existingSecret"},
		{name: "no secrets key", values: `secretsKey: {existingSecret: ""}`, wantErr: "set secretsKey.existingSecret"},
		{name: "setting that is no AENV_ variable", values: `config: {DOMAIN: x}`, wantErr: "settings are AENV_* variables"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := chartDir
			if tt.file != "" {
				dir = copyChart(t)
				f := filepath.Join(dir, tt.file)
				data, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(string(data), tt.old) {
					t.Fatalf("%s does not contain %q", tt.file, tt.old)
				}
				if err := os.WriteFile(f, []byte(strings.Replace(string(data), tt.old, tt.new, 1)), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			r, err := h.render(dir, tt.values)
			if err == nil {
				err = consistent(r, defaultExternal)
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// copyChart copies the chart to a directory of the test's own.
func copyChart(t *testing.T) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "aenv")
	if err := os.CopyFS(dst, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	return dst
}

// rawSettings are the values that give the objects of deploy/kubernetes:
// the placeholder Secrets there.
const rawSettings = `
database: {url: "postgres://aenv:CHANGE-ME@postgres.example.internal:5432/aenv?sslmode=require"}
secretsKey: {key: CHANGE-ME}
`

// helmLabels are the labels the chart adds to what deploy/kubernetes has:
// they say which release owns an object.
var helmLabels = []string{"app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "helm.sh/chart"}

// TestChartAgreesWithManifests: deploy/kubernetes (applied with kubectl
// apply -k) and the chart are two ways to install the same thing, kept side
// by side. Rendered with the settings of the raw manifests, the chart must
// give every object of deploy/kubernetes, field for field, but for the
// release's own labels; the Namespace alone is not the chart's (Helm installs
// into a namespace, it does not own it).
func TestChartAgreesWithManifests(t *testing.T) {
	h := newHelm(t)
	chart, err := h.render(chartDir, rawSettings)
	if err != nil {
		t.Fatal(err)
	}
	raw := loadRaw(t)
	chartOnly := map[string]bool{}
	for key := range chart.objects {
		chartOnly[key] = true
	}
	for key, want := range raw.objects {
		if strings.HasPrefix(key, "Namespace/") {
			continue
		}
		got, ok := chart.objects[key]
		if !ok {
			t.Errorf("%s is in deploy/kubernetes and not rendered by the chart", key)
			continue
		}
		delete(chartOnly, key)
		g, w := normalize(t, got), normalize(t, want)
		if err := sameJSON(g, w, key); err != nil {
			t.Errorf("chart and deploy/kubernetes differ: %v", err)
		}
	}
	for key := range chartOnly {
		t.Errorf("%s is rendered by the chart and not in deploy/kubernetes", key)
	}
}

// loadRaw decodes every manifest of deploy/kubernetes.
func loadRaw(t *testing.T) *rendered {
	t.Helper()
	files, err := filepath.Glob("../kubernetes/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var all []byte
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(append(all, "\n---\n"...), data...)
	}
	r, err := decodeAll(all)
	if err != nil {
		t.Fatalf("deploy/kubernetes: %v", err)
	}
	return r
}

// normalize is obj as generic JSON without the chart's release labels.
func normalize(t *testing.T, obj any) any {
	t.Helper()
	js, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(js, &v); err != nil {
		t.Fatal(err)
	}
	var strip func(any)
	strip = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for _, l := range helmLabels {
				delete(v, l)
			}
			for _, x := range v {
				strip(x)
			}
		case []any:
			for _, x := range v {
				strip(x)
			}
		}
	}
	strip(v)
	return v
}

// sameJSON reports the first place where got and want differ.
func sameJSON(got, want any, path string) error {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: chart has %v, manifests an object", path, got)
		}
		keys := map[string]bool{}
		for k := range w {
			keys[k] = true
		}
		for k := range g {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			if err := sameJSON(g[k], w[k], path+"."+k); err != nil {
				return err
			}
		}
		return nil
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Errorf("%s: chart has %v, manifests %v", path, got, want)
		}
		for i := range w {
			if err := sameJSON(g[i], w[i], fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	}
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("%s: chart has %v, manifests %v", path, got, want)
	}
	return nil
}
