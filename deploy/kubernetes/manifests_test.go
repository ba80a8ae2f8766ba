// Package kubernetes_test checks the Kubernetes manifests beside it without a
// cluster: every document decodes strictly into its Kubernetes API type (a
// misspelled field fails here, not at apply time), the kustomization lists
// exactly the manifests, and the properties aenv depends on hold.
package kubernetes_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/aenv-dev/aenv/deploy/kubernetes/kubedecode"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const (
	namespace      = "aenv"
	kustomization  = "kustomization.yaml"
	nodeName       = "aenv-node"
	gatewayName    = "aenv-gateway"
	databaseSecret = "aenv-database"
	secretsKey     = "aenv-secrets-key"
	nameLabel      = "app.kubernetes.io/name"
)

// kinds maps apiVersion/kind to a constructor of its Kubernetes API type.
// A kind not listed here fails the test: add it with its type.
var kinds = kubedecode.Kinds{
	"v1/Namespace":                  func() any { return &corev1.Namespace{} },
	"v1/ConfigMap":                  func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                     func() any { return &corev1.Secret{} },
	"v1/Service":                    func() any { return &corev1.Service{} },
	"apps/v1/DaemonSet":             func() any { return &appsv1.DaemonSet{} },
	"apps/v1/Deployment":            func() any { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget": func() any { return &policyv1.PodDisruptionBudget{} },
}

// documentSeparator is a YAML document marker on a line of its own.
var documentSeparator = kubedecode.DocumentSeparator

// decodeStrict turns one YAML document into its Kubernetes API type (nil
// for a document with no content), as kubedecode.Strict does.
func decodeStrict(doc []byte) (any, error) { return kubedecode.Strict(doc, kinds) }

// manifests is every object decoded from the folder, by kind and name.
type manifests struct {
	namespaces  map[string]*corev1.Namespace
	configMaps  map[string]*corev1.ConfigMap
	secrets     map[string]*corev1.Secret
	services    map[string]*corev1.Service
	daemonSets  map[string]*appsv1.DaemonSet
	deployments map[string]*appsv1.Deployment
	pdbs        map[string]*policyv1.PodDisruptionBudget
}

// workload is a pod template with the selector of what owns it.
type workload struct {
	name     string
	selector map[string]string
	template corev1.PodTemplateSpec
}

func (m *manifests) workloads() []workload {
	var ws []workload
	for _, d := range m.daemonSets {
		ws = append(ws, workload{"DaemonSet/" + d.Name, d.Spec.Selector.MatchLabels, d.Spec.Template})
	}
	for _, d := range m.deployments {
		ws = append(ws, workload{"Deployment/" + d.Name, d.Spec.Selector.MatchLabels, d.Spec.Template})
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].name < ws[j].name })
	return ws
}

// yamlFiles lists the folder's *.yaml files other than the kustomization.
func yamlFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	files = slices.DeleteFunc(files, func(f string) bool { return f == kustomization })
	if len(files) == 0 {
		t.Fatal("no manifests found")
	}
	return files
}

// load decodes every manifest of the folder, failing the test on any error.
func load(t *testing.T) *manifests {
	t.Helper()
	m := &manifests{
		namespaces: map[string]*corev1.Namespace{}, configMaps: map[string]*corev1.ConfigMap{},
		secrets: map[string]*corev1.Secret{}, services: map[string]*corev1.Service{},
		daemonSets: map[string]*appsv1.DaemonSet{}, deployments: map[string]*appsv1.Deployment{},
		pdbs: map[string]*policyv1.PodDisruptionBudget{},
	}
	for _, file := range yamlFiles(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range documentSeparator.Split(string(data), -1) {
			obj, err := decodeStrict([]byte(doc))
			if err != nil {
				t.Errorf("%s, document %d: %v", file, i+1, err)
				continue
			}
			if obj != nil {
				if err := m.add(obj); err != nil {
					t.Errorf("%s, document %d: %v", file, i+1, err)
				}
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return m
}

func (m *manifests) add(obj any) error {
	switch o := obj.(type) {
	case *corev1.Namespace:
		return addTo(m.namespaces, "Namespace", o.Name, o)
	case *corev1.ConfigMap:
		return addTo(m.configMaps, "ConfigMap", o.Name, o)
	case *corev1.Secret:
		return addTo(m.secrets, "Secret", o.Name, o)
	case *corev1.Service:
		return addTo(m.services, "Service", o.Name, o)
	case *appsv1.DaemonSet:
		return addTo(m.daemonSets, "DaemonSet", o.Name, o)
	case *appsv1.Deployment:
		return addTo(m.deployments, "Deployment", o.Name, o)
	case *policyv1.PodDisruptionBudget:
		return addTo(m.pdbs, "PodDisruptionBudget", o.Name, o)
	}
	return fmt.Errorf("no place for %T", obj)
}

func addTo[T any](objects map[string]*T, kind, name string, o *T) error {
	if name == "" {
		return fmt.Errorf("%s without a name", kind)
	}
	if _, dup := objects[name]; dup {
		return fmt.Errorf("%s %s defined twice", kind, name)
	}
	objects[name] = o
	return nil
}

// TestDecodeIsStrict shows that the decoder used on the manifests rejects
// the mistakes it is there to catch.
func TestDecodeIsStrict(t *testing.T) {
	const valid = `
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: x
spec:
  selector:
    matchLabels: {a: b}
  template:
    metadata:
      labels: {a: b}
    spec:
      hostNetwork: true
      containers:
        - name: c
          image: i
          resources:
            requests: {cpu: 100m, memory: 2Gi}
`
	tests := []struct {
		name    string
		doc     string
		wantErr string // "" means it must decode
	}{
		{"valid", valid, ""},
		{"comments only", "# nothing\n", ""},
		{"misspelled field", strings.Replace(valid, "hostNetwork", "hostNetwrok", 1), "unknown field"},
		{"field in the wrong case", strings.Replace(valid, "hostNetwork", "hostnetwork", 1), "mind the case"},
		{"field at the wrong level", strings.Replace(valid, "      hostNetwork: true", "      image: x\n      hostNetwork: true", 1), "unknown field"},
		{"wrong value type", strings.Replace(valid, "hostNetwork: true", `hostNetwork: "yes"`, 1), "cannot unmarshal"},
		{"bad quantity", strings.Replace(valid, "2Gi", "2GB", 1), "quantities must match"},
		{"key given twice", strings.Replace(valid, "      hostNetwork: true", "      hostNetwork: true\n      hostNetwork: false", 1), "already set"},
		{"unknown kind", strings.Replace(valid, "kind: DaemonSet", "kind: DaemonSets", 1), "unknown kind"},
		{"kind of another apiVersion", strings.Replace(valid, "apps/v1", "extensions/v1beta1", 1), "unknown kind"},
		{"no kind", strings.Replace(valid, "kind: DaemonSet\n", "", 1), "unknown kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeStrict([]byte(tt.doc))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("want no error, got %v", err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("want an error with %q, got none", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Fatalf("want an error with %q, got %v", tt.wantErr, err)
			}
		})
	}
}

// TestKustomization: `kubectl apply -k` applies exactly the manifests of the
// folder.
func TestKustomization(t *testing.T) {
	data, err := os.ReadFile(kustomization)
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		t.Fatal(err)
	}
	// Only the fields used here: anything else is new and wants a look.
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&k); err != nil {
		t.Fatalf("%s: %v", kustomization, err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("%s: apiVersion %q kind %q", kustomization, k.APIVersion, k.Kind)
	}
	listed := map[string]bool{}
	for _, r := range k.Resources {
		if listed[r] {
			t.Errorf("%s lists %s twice", kustomization, r)
		}
		listed[r] = true
		if _, err := os.Stat(r); err != nil {
			t.Errorf("%s lists %s: %v", kustomization, r, err)
		}
	}
	for _, f := range yamlFiles(t) {
		if !listed[f] {
			t.Errorf("%s is not listed in %s", f, kustomization)
		}
	}
}

// TestManifests checks what aenv needs of its deployment.
func TestManifests(t *testing.T) {
	m := load(t)
	node := m.daemonSets[nodeName]
	gateway := m.deployments[gatewayName]
	if node == nil || gateway == nil {
		t.Fatalf("want DaemonSet %s and Deployment %s", nodeName, gatewayName)
	}
	nodePod, gatewayPod := node.Spec.Template.Spec, gateway.Spec.Template.Spec

	tests := []struct {
		name  string
		check func() error
	}{
		{"node runs `aenv node`", func() error { return runs(nodePod, "node") }},
		{"node uses the host network", func() error {
			return want(nodePod.HostNetwork && nodePod.DNSPolicy == corev1.DNSClusterFirstWithHostNet,
				"hostNetwork %v, dnsPolicy %q", nodePod.HostNetwork, nodePod.DNSPolicy)
		}},
		{"node shares the host PID namespace", func() error { return want(nodePod.HostPID, "hostPID false") }},
		{"node is privileged root", func() error {
			sc := container(nodePod).SecurityContext
			return want(sc != nil && isTrue(sc.Privileged) && sc.RunAsUser != nil && *sc.RunAsUser == 0,
				"securityContext %+v", sc)
		}},
		{"node mounts /run/netns from the host, bidirectional", func() error {
			return hostMount(nodePod, "/run/netns", "/run/netns", corev1.MountPropagationBidirectional)
		}},
		{"node mounts its data dir from the host, bidirectional", func() error {
			if err := hostMount(nodePod, "/var/lib/aenv", "/var/lib/aenv", corev1.MountPropagationBidirectional); err != nil {
				return err
			}
			return envValue(nodePod, "AENV_DATA_DIR", "/var/lib/aenv")
		}},
		{"node mounts the host's cgroups", func() error {
			return hostMount(nodePod, "/sys/fs/cgroup", "/sys/fs/cgroup", "")
		}},
		{"node probes /health on its listen port", func() error { return probes(nodePod, true) }},
		{"node reads the database URL from its secret", func() error {
			return fromSecret(nodePod, "AENV_DATABASE_URL", databaseSecret, "url")
		}},
		{"node ID is the Kubernetes node name", func() error {
			return fromField(nodePod, "AENV_NODE_ID", "spec.nodeName")
		}},
		{"node advertises the host IP and its listen port", func() error { return advertisesHostIP(nodePod) }},
		{"the namespace admits the privileged node", func() error {
			ns := m.namespaces[namespace]
			if ns == nil {
				return fmt.Errorf("no Namespace %s", namespace)
			}
			level := ns.Labels["pod-security.kubernetes.io/enforce"]
			return want(level == "privileged", "Pod Security enforce level %q", level)
		}},
		{"node lands on labelled machines only", func() error {
			v := nodePod.NodeSelector["aenv.dev/node"]
			return want(v == "true", "nodeSelector %v", nodePod.NodeSelector)
		}},
		{"node updates one machine at a time, old pod first", func() error {
			s := node.Spec.UpdateStrategy
			ok := s.Type == appsv1.RollingUpdateDaemonSetStrategyType && s.RollingUpdate != nil &&
				s.RollingUpdate.MaxUnavailable != nil && s.RollingUpdate.MaxUnavailable.String() == "1" &&
				(s.RollingUpdate.MaxSurge == nil || s.RollingUpdate.MaxSurge.String() == "0")
			return want(ok, "updateStrategy %+v", s)
		}},
		{"node has time to stop", func() error {
			g := nodePod.TerminationGracePeriodSeconds
			return want(g != nil && *g >= 30, "terminationGracePeriodSeconds %v", g)
		}},
		{"gateway runs `aenv gateway`", func() error { return runs(gatewayPod, "gateway") }},
		{"gateway has 2 replicas", func() error {
			r := gateway.Spec.Replicas
			return want(r != nil && *r == 2, "replicas %v", r)
		}},
		{"gateway runs unprivileged", func() error { return unprivileged(gatewayPod) }},
		{"gateway probes /health on its listen port", func() error { return probes(gatewayPod, false) }},
		{"gateway reads the database URL from its secret", func() error {
			return fromSecret(gatewayPod, "AENV_DATABASE_URL", databaseSecret, "url")
		}},
		{"node reads the secrets key file from its secret", func() error {
			return secretFile(nodePod, "AENV_SECRETS_KEY_FILE", secretsKey, "key")
		}},
		{"gateway reads the secrets key file from its secret", func() error {
			return secretFile(gatewayPod, "AENV_SECRETS_KEY_FILE", secretsKey, "key")
		}},
		{"gateway has a disruption budget", func() error {
			for _, p := range m.pdbs {
				if p.Spec.Selector != nil && selects(p.Spec.Selector.MatchLabels, gateway.Spec.Template.Labels) {
					return want(p.Spec.MinAvailable != nil && p.Spec.MinAvailable.IntValue() >= 1,
						"PodDisruptionBudget %s: minAvailable %v", p.Name, p.Spec.MinAvailable)
				}
			}
			return errors.New("no PodDisruptionBudget selects the gateway")
		}},
		{"gateway service maps port 80 to the gateway's port", func() error {
			s := m.services[gatewayName]
			if s == nil {
				return errors.New("no Service " + gatewayName)
			}
			for _, p := range s.Spec.Ports {
				if p.Port == 80 {
					port, err := containerPort(gatewayPod, p.TargetPort.String())
					if err != nil {
						return err
					}
					return want(port == 8000, "port 80 targets %d", port)
				}
			}
			return errors.New("no port 80")
		}},
		{"node and gateway run the same image", func() error {
			a, b := container(nodePod).Image, container(gatewayPod).Image
			return want(a != "" && a == b, "images %q and %q", a, b)
		}},
		{"workload selectors match their pod labels", func() error {
			for _, w := range m.workloads() {
				if len(w.selector) == 0 || !selects(w.selector, w.template.Labels) {
					return fmt.Errorf("%s: selector %v, pod labels %v", w.name, w.selector, w.template.Labels)
				}
			}
			return nil
		}},
		{"every service selects a workload's pods, on a port they have", func() error {
			return m.servicesSelectWorkloads()
		}},
		{"every disruption budget selects a workload", func() error {
			for _, p := range m.pdbs {
				if p.Spec.Selector == nil || len(p.Spec.Selector.MatchLabels) == 0 || m.selected(p.Spec.Selector.MatchLabels) == nil {
					return fmt.Errorf("PodDisruptionBudget %s selects no workload", p.Name)
				}
			}
			return nil
		}},
		{"every secret and config map referenced exists", func() error { return m.referencesResolve() }},
		{"every object is in the aenv namespace and labelled", func() error { return m.namespacedAndLabelled() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.check(); err != nil {
				t.Error(err)
			}
		})
	}
}

func want(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf(format, args...)
}

func isTrue(b *bool) bool { return b != nil && *b }

// container is the pod's one container (each aenv pod has exactly one).
func container(pod corev1.PodSpec) *corev1.Container {
	if len(pod.Containers) != 1 {
		return &corev1.Container{}
	}
	return &pod.Containers[0]
}

func runs(pod corev1.PodSpec, command string) error {
	if len(pod.Containers) != 1 {
		return fmt.Errorf("%d containers, want 1", len(pod.Containers))
	}
	c := container(pod)
	argv := append(slices.Clone(c.Command), c.Args...)
	return want(slices.Equal(argv, []string{"aenv", command}), "runs %q", argv)
}

func env(pod corev1.PodSpec, name string) (corev1.EnvVar, int, error) {
	for i, e := range container(pod).Env {
		if e.Name == name {
			return e, i, nil
		}
	}
	return corev1.EnvVar{}, -1, fmt.Errorf("%s is not set", name)
}

func envValue(pod corev1.PodSpec, name, value string) error {
	e, _, err := env(pod, name)
	if err != nil {
		return err
	}
	return want(e.ValueFrom == nil && e.Value == value, "%s is %q, want %q", name, e.Value, value)
}

func fromSecret(pod corev1.PodSpec, name, secret, key string) error {
	e, _, err := env(pod, name)
	if err != nil {
		return err
	}
	var ref *corev1.SecretKeySelector
	if e.ValueFrom != nil {
		ref = e.ValueFrom.SecretKeyRef
	}
	return want(ref != nil && ref.Name == secret && ref.Key == key && !isTrue(ref.Optional),
		"%s: want the required key %s of secret %s, got %+v", name, key, secret, e.ValueFrom)
}

// secretFile: env var name is the path of key of secret, mounted
// read-only from a required secret volume that the pod's user can read.
func secretFile(pod corev1.PodSpec, name, secret, key string) error {
	e, _, err := env(pod, name)
	if err != nil {
		return err
	}
	for _, m := range container(pod).VolumeMounts {
		if path.Join(m.MountPath, key) != e.Value {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			mode := int32(0o644) // Kubernetes' default
			if v.Secret.DefaultMode != nil {
				mode = *v.Secret.DefaultMode
			}
			readable := mode&0o004 != 0 || (mode&0o040 != 0 && pod.SecurityContext != nil &&
				pod.SecurityContext.FSGroup != nil) || isRoot(pod)
			return want(v.Secret.SecretName == secret && !isTrue(v.Secret.Optional) && m.ReadOnly && readable,
				"%s: volume %s is secret %q (optional %v, read-only %v, mode %o), want required %q readable by the pod",
				name, v.Name, v.Secret.SecretName, isTrue(v.Secret.Optional), m.ReadOnly, mode, secret)
		}
	}
	return fmt.Errorf("%s=%q is in no secret volume mount", name, e.Value)
}

// isRoot: the pod's container runs as root.
func isRoot(pod corev1.PodSpec) bool {
	sc := container(pod).SecurityContext
	return sc != nil && sc.RunAsUser != nil && *sc.RunAsUser == 0
}

func fromField(pod corev1.PodSpec, name, field string) error {
	e, _, err := env(pod, name)
	if err != nil {
		return err
	}
	ok := e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == field
	return want(ok, "%s: want the field %s, got %+v", name, field, e.ValueFrom)
}

// listenPort is the port of AENV_LISTEN (":8000").
func listenPort(pod corev1.PodSpec) (string, error) {
	e, _, err := env(pod, "AENV_LISTEN")
	if err != nil {
		return "", err
	}
	i := strings.LastIndex(e.Value, ":")
	if i < 0 || i == len(e.Value)-1 {
		return "", fmt.Errorf("AENV_LISTEN %q has no port", e.Value)
	}
	return e.Value[i+1:], nil
}

// advertisesHostIP: AENV_ADVERTISE is $(HOST_IP):<listen port>, with HOST_IP
// the host's IP and defined before it (Kubernetes expands only earlier
// variables).
func advertisesHostIP(pod corev1.PodSpec) error {
	port, err := listenPort(pod)
	if err != nil {
		return err
	}
	adv, advAt, err := env(pod, "AENV_ADVERTISE")
	if err != nil {
		return err
	}
	if want := "$(HOST_IP):" + port; adv.Value != want {
		return fmt.Errorf("AENV_ADVERTISE is %q, want %q", adv.Value, want)
	}
	if err := fromField(pod, "HOST_IP", "status.hostIP"); err != nil {
		return err
	}
	_, hostAt, _ := env(pod, "HOST_IP")
	return want(hostAt < advAt, "HOST_IP is defined after AENV_ADVERTISE")
}

func containerPort(pod corev1.PodSpec, nameOrNumber string) (int32, error) {
	for _, p := range container(pod).Ports {
		if p.Name == nameOrNumber || fmt.Sprint(p.ContainerPort) == nameOrNumber {
			return p.ContainerPort, nil
		}
	}
	return 0, fmt.Errorf("no container port %q", nameOrNumber)
}

// probes: readiness and liveness ask GET /health on the listen port, and so
// does a startup probe where one is wanted.
func probes(pod corev1.PodSpec, wantStartup bool) error {
	port, err := listenPort(pod)
	if err != nil {
		return err
	}
	c := container(pod)
	check := func(what string, p *corev1.Probe) error {
		if p == nil || p.HTTPGet == nil {
			return fmt.Errorf("no HTTP %s probe", what)
		}
		n, err := containerPort(pod, p.HTTPGet.Port.String())
		if err != nil {
			return fmt.Errorf("%s probe: %w", what, err)
		}
		return want(p.HTTPGet.Path == "/health" && fmt.Sprint(n) == port,
			"%s probe asks %s on port %d, want /health on %s", what, p.HTTPGet.Path, n, port)
	}
	all := map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe}
	if wantStartup {
		all["startup"] = c.StartupProbe
	}
	var errs []error
	for what, p := range all {
		errs = append(errs, check(what, p))
	}
	return errors.Join(errs...)
}

// hostMount: the container mounts the host's hostPath at mountPath with the
// given propagation ("" for none).
func hostMount(pod corev1.PodSpec, hostPath, mountPath string, propagation corev1.MountPropagationMode) error {
	for _, vm := range container(pod).VolumeMounts {
		if vm.MountPath != mountPath {
			continue
		}
		var got corev1.MountPropagationMode
		if vm.MountPropagation != nil {
			got = *vm.MountPropagation
		}
		if got != propagation {
			return fmt.Errorf("%s: propagation %q, want %q", mountPath, got, propagation)
		}
		for _, v := range pod.Volumes {
			if v.Name == vm.Name {
				return want(v.HostPath != nil && v.HostPath.Path == hostPath,
					"%s: volume %s is not the host's %s", mountPath, v.Name, hostPath)
			}
		}
		return fmt.Errorf("%s: no volume %s", mountPath, vm.Name)
	}
	return fmt.Errorf("%s is not mounted", mountPath)
}

func unprivileged(pod corev1.PodSpec) error {
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		return errors.New("shares a host namespace")
	}
	c := container(pod)
	sc, psc := c.SecurityContext, pod.SecurityContext
	if sc == nil || psc == nil {
		return errors.New("no securityContext")
	}
	nonRoot := isTrue(sc.RunAsNonRoot) || (sc.RunAsNonRoot == nil && isTrue(psc.RunAsNonRoot))
	uid := sc.RunAsUser
	if uid == nil {
		uid = psc.RunAsUser
	}
	switch {
	case !nonRoot || (uid != nil && *uid == 0):
		return fmt.Errorf("may run as root: runAsNonRoot %v, runAsUser %v", nonRoot, uid)
	case isTrue(sc.Privileged):
		return errors.New("privileged")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		return errors.New("allowPrivilegeEscalation is not false")
	case !isTrue(sc.ReadOnlyRootFilesystem):
		return errors.New("root filesystem is writable")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		return fmt.Errorf("capabilities %+v, want all dropped", sc.Capabilities)
	}
	return nil
}

// selects reports whether a matchLabels selector matches labels.
func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// selected is the first workload whose pods the selector matches.
func (m *manifests) selected(selector map[string]string) *workload {
	for _, w := range m.workloads() {
		if selects(selector, w.template.Labels) {
			return &w
		}
	}
	return nil
}

func (m *manifests) servicesSelectWorkloads() error {
	for _, s := range m.services {
		if len(s.Spec.Selector) == 0 {
			return fmt.Errorf("Service %s has no selector", s.Name)
		}
		w := m.selected(s.Spec.Selector)
		if w == nil {
			return fmt.Errorf("Service %s selects no workload's pods", s.Name)
		}
		for _, p := range s.Spec.Ports {
			if _, err := containerPort(w.template.Spec, p.TargetPort.String()); err != nil {
				return fmt.Errorf("Service %s port %d: %s: %w", s.Name, p.Port, w.name, err)
			}
		}
	}
	return nil
}

// referencesResolve: every secret and config map a pod reads is in the
// folder with the key read, unless the reference is optional (an operator's
// choice to create it).
func (m *manifests) referencesResolve() error {
	secretHas := func(name, key string) bool {
		s := m.secrets[name]
		if s == nil {
			return false
		}
		_, inData := s.Data[key]
		_, inString := s.StringData[key]
		return key == "" || inData || inString
	}
	configMapHas := func(name, key string) bool {
		c := m.configMaps[name]
		if c == nil {
			return false
		}
		_, ok := c.Data[key]
		return key == "" || ok
	}
	var errs []error
	for _, w := range m.workloads() {
		for _, ref := range kubedecode.PodReferences(w.template.Spec) {
			has := secretHas
			if ref.Kind == "ConfigMap" {
				has = configMapHas
			}
			if !ref.Optional && !has(ref.Name, ref.Key) {
				errs = append(errs, fmt.Errorf("%s reads %s %s (key %q), which is not in the folder", w.name, ref.Kind, ref.Name, ref.Key))
			}
		}
	}
	return errors.Join(errs...)
}

func (m *manifests) namespacedAndLabelled() error {
	if m.namespaces[namespace] == nil {
		return fmt.Errorf("no Namespace %s", namespace)
	}
	var errs []error
	check := func(kind, name, ns string, labels map[string]string) {
		if kind != "Namespace" && ns != namespace {
			errs = append(errs, fmt.Errorf("%s %s is in namespace %q", kind, name, ns))
		}
		if labels[nameLabel] != "aenv" {
			errs = append(errs, fmt.Errorf("%s %s lacks the label %s=aenv", kind, name, nameLabel))
		}
	}
	for _, o := range m.namespaces {
		check("Namespace", o.Name, o.Namespace, o.Labels)
	}
	for _, o := range m.configMaps {
		check("ConfigMap", o.Name, o.Namespace, o.Labels)
	}
	for _, o := range m.secrets {
		check("Secret", o.Name, o.Namespace, o.Labels)
	}
	for _, o := range m.services {
		check("Service", o.Name, o.Namespace, o.Labels)
	}
	for _, o := range m.daemonSets {
		check("DaemonSet", o.Name, o.Namespace, o.Labels)
	}
	for _, o := range m.deployments {
		check("Deployment", o.Name, o.Namespace, o.Labels)
	}
	for _, o := range m.pdbs {
		check("PodDisruptionBudget", o.Name, o.Namespace, o.Labels)
	}
	return errors.Join(errs...)
}
