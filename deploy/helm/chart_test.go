// Package helm_test checks the Helm chart beside it without a cluster: it
// is linted and rendered by the helm CLI (bin/helm, built from tools/helm)
// with its default values and several value sets, every document rendered
// decodes strictly into its Kubernetes API type, the objects refer to each
// other consistently, and rendered with the raw manifests' settings the chart
// gives the objects of deploy/kubernetes.
package helm_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"

	"github.com/aenv-dev/aenv/deploy/kubernetes/kubedecode"
	"github.com/aenv-dev/aenv/internal/roottest"
)

const (
	chartDir  = "aenv"
	release   = "aenv"
	namespace = "aenv"
	nameLabel = "app.kubernetes.io/name"
)

// helmBinary is $AENV_BIN_DIR/helm, else bin/helm at the module root.
// Without it the test is skipped, or fails where tests may not skip (make
// test and CI set AENV_REQUIRE_ROOT_TESTS=1, and build it first).
func helmBinary(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("AENV_BIN_DIR")
	if dir == "" {
		abs, err := filepath.Abs("../../bin")
		if err != nil {
			t.Fatal(err)
		}
		dir = abs
	}
	bin := filepath.Join(dir, "helm")
	if _, err := os.Stat(bin); err != nil {
		roottest.SkipOrFail(t, fmt.Sprintf("helm missing in %s (run `make helm`)", dir))
	}
	return bin
}

// helm runs the helm CLI with its configuration and cache in a directory of
// the test's own, so that nothing of the user's is read or written.
type helm struct {
	bin  string
	home string
}

func newHelm(t *testing.T) helm {
	return helm{bin: helmBinary(t), home: t.TempDir()}
}

func (h helm) run(args ...string) ([]byte, error) {
	cmd := exec.Command(h.bin, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(h.home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(h.home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(h.home, "data"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm %s: %w: %s %s", args[0], err, bytes.TrimSpace(stderr.Bytes()), bytes.TrimSpace(out))
	}
	return out, nil
}

// render lints the chart in dir with the given values (YAML; "" for the
// defaults), renders it and decodes every document.
func (h helm) render(dir, values string) (*rendered, error) {
	var valueArgs []string
	if values != "" {
		f := filepath.Join(h.home, "values.yaml")
		if err := os.WriteFile(f, []byte(values), 0o644); err != nil {
			return nil, err
		}
		valueArgs = []string{"--values", f}
	}
	if _, err := h.run(append([]string{"lint", "--strict", "--namespace", namespace, dir}, valueArgs...)...); err != nil {
		return nil, err
	}
	out, err := h.run(append([]string{"template", release, dir, "--namespace", namespace}, valueArgs...)...)
	if err != nil {
		return nil, err
	}
	return decodeAll(out)
}

// rendered is every object the chart gave, by kind and name.
type rendered struct {
	objects map[string]any // "Kind/name"
}

func decodeAll(out []byte) (*rendered, error) {
	r := &rendered{objects: map[string]any{}}
	var errs []error
	for i, doc := range documentSeparator.Split(string(out), -1) {
		obj, err := decodeStrict([]byte(doc))
		if err != nil {
			errs = append(errs, fmt.Errorf("document %d (%s): %w", i+1, source(doc), err))
			continue
		}
		if obj == nil {
			continue
		}
		key := kindOf(obj) + "/" + nameOf(obj)
		if nameOf(obj) == "" {
			errs = append(errs, fmt.Errorf("document %d (%s): %s without a name", i+1, source(doc), kindOf(obj)))
		} else if _, dup := r.objects[key]; dup {
			errs = append(errs, fmt.Errorf("%s rendered twice", key))
		}
		r.objects[key] = obj
	}
	if len(r.objects) == 0 {
		errs = append(errs, errors.New("nothing rendered"))
	}
	return r, errors.Join(errs...)
}

// source is the template a rendered document came from.
func source(doc string) string {
	for _, line := range strings.Split(doc, "\n") {
		if s, ok := strings.CutPrefix(line, "# Source: "); ok {
			return s
		}
	}
	return "no source"
}

func kindOf(obj any) string {
	switch obj.(type) {
	case *corev1.Namespace:
		return "Namespace"
	case *corev1.ConfigMap:
		return "ConfigMap"
	case *corev1.Secret:
		return "Secret"
	case *corev1.Service:
		return "Service"
	case *appsv1.DaemonSet:
		return "DaemonSet"
	case *appsv1.Deployment:
		return "Deployment"
	case *policyv1.PodDisruptionBudget:
		return "PodDisruptionBudget"
	case *networkingv1.Ingress:
		return "Ingress"
	case *serviceMonitor:
		return "ServiceMonitor"
	}
	return fmt.Sprintf("%T", obj)
}

// meta gives the namespace, name and labels of any decoded object.
func meta(obj any) (ns, name string, labels map[string]string) {
	switch o := obj.(type) {
	case *corev1.Namespace:
		return o.Namespace, o.Name, o.Labels
	case *corev1.ConfigMap:
		return o.Namespace, o.Name, o.Labels
	case *corev1.Secret:
		return o.Namespace, o.Name, o.Labels
	case *corev1.Service:
		return o.Namespace, o.Name, o.Labels
	case *appsv1.DaemonSet:
		return o.Namespace, o.Name, o.Labels
	case *appsv1.Deployment:
		return o.Namespace, o.Name, o.Labels
	case *policyv1.PodDisruptionBudget:
		return o.Namespace, o.Name, o.Labels
	case *networkingv1.Ingress:
		return o.Namespace, o.Name, o.Labels
	case *serviceMonitor:
		return o.Namespace, o.Name, o.Labels
	}
	return "", "", nil
}

func nameOf(obj any) string {
	_, name, _ := meta(obj)
	return name
}

// get returns the object kind/name as a T, or nil.
func get[T any](r *rendered, kind, name string) *T {
	o, _ := r.objects[kind+"/"+name].(*T)
	return o
}

func all[T any](r *rendered) []*T {
	var keys []string
	for k, o := range r.objects {
		if _, ok := o.(*T); ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var out []*T
	for _, k := range keys {
		out = append(out, r.objects[k].(*T))
	}
	return out
}

// workload is a pod template with the name of what owns it.
type workload struct {
	name     string
	template corev1.PodTemplateSpec
}

func (r *rendered) workloads() []workload {
	var ws []workload
	for _, d := range all[appsv1.DaemonSet](r) {
		ws = append(ws, workload{"DaemonSet/" + d.Name, d.Spec.Template})
	}
	for _, d := range all[appsv1.Deployment](r) {
		ws = append(ws, workload{"Deployment/" + d.Name, d.Spec.Template})
	}
	return ws
}

// node is the nodes' DaemonSet and gateway the gateways' Deployment (there
// is one of each, which consistent checks).
func (r *rendered) node() *appsv1.DaemonSet {
	if ds := all[appsv1.DaemonSet](r); len(ds) == 1 {
		return ds[0]
	}
	return nil
}

func (r *rendered) gateway() *appsv1.Deployment {
	if ds := all[appsv1.Deployment](r); len(ds) == 1 {
		return ds[0]
	}
	return nil
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// consistent checks what must hold whatever the values: the workloads
// exist and their selectors match their pods; every Secret and ConfigMap
// a pod reads is rendered with the key read, or named in external (Secrets
// the operator creates), or optional; Services, the PodDisruptionBudget,
// the Ingress and the ServiceMonitor reach what they point at; every object
// is in the release's namespace and labelled.
func consistent(r *rendered, external []string) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if r.node() == nil || r.gateway() == nil {
		return fmt.Errorf("%d DaemonSets and %d Deployments, want one of each",
			len(all[appsv1.DaemonSet](r)), len(all[appsv1.Deployment](r)))
	}
	for _, d := range all[appsv1.DaemonSet](r) {
		if d.Spec.Selector == nil || !selects(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
			fail("DaemonSet %s: its selector does not match its pods", d.Name)
		}
	}
	for _, d := range all[appsv1.Deployment](r) {
		if d.Spec.Selector == nil || !selects(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
			fail("Deployment %s: its selector does not match its pods", d.Name)
		}
	}
	secretHas := func(name, key string) bool {
		if slices.Contains(external, name) {
			return true
		}
		s := get[corev1.Secret](r, "Secret", name)
		if s == nil {
			return false
		}
		_, inData := s.Data[key]
		_, inString := s.StringData[key]
		return key == "" || inData || inString
	}
	configMapHas := func(name, key string) bool {
		c := get[corev1.ConfigMap](r, "ConfigMap", name)
		if c == nil {
			return false
		}
		_, ok := c.Data[key]
		return key == "" || ok
	}
	for _, w := range r.workloads() {
		for _, ref := range kubedecode.PodReferences(w.template.Spec) {
			has := secretHas
			if ref.Kind == "ConfigMap" {
				has = configMapHas
			}
			if !ref.Optional && !has(ref.Name, ref.Key) {
				fail("%s reads %s %s (key %q), which is neither rendered nor created by the operator", w.name, ref.Kind, ref.Name, ref.Key)
			}
		}
	}
	portsOf := func(selector map[string]string) (names []string, numbers []int32) {
		for _, w := range r.workloads() {
			if !selects(selector, w.template.Labels) {
				continue
			}
			for _, c := range w.template.Spec.Containers {
				for _, p := range c.Ports {
					names, numbers = append(names, p.Name), append(numbers, p.ContainerPort)
				}
			}
		}
		return names, numbers
	}
	for _, s := range all[corev1.Service](r) {
		names, numbers := portsOf(s.Spec.Selector)
		if len(names) == 0 {
			fail("Service %s selects no pods with ports", s.Name)
		}
		for _, p := range s.Spec.Ports {
			t := p.TargetPort
			if !slices.Contains(names, t.String()) && !slices.Contains(numbers, t.IntVal) {
				fail("Service %s: target port %s is no container port of its pods", s.Name, t.String())
			}
		}
	}
	for _, p := range all[policyv1.PodDisruptionBudget](r) {
		if p.Spec.Selector == nil || len(r.selected(p.Spec.Selector.MatchLabels)) == 0 {
			fail("PodDisruptionBudget %s selects no pods", p.Name)
		}
	}
	for _, in := range all[networkingv1.Ingress](r) {
		for _, rule := range in.Spec.Rules {
			if rule.HTTP == nil {
				fail("Ingress %s: host %s has no paths", in.Name, rule.Host)
				continue
			}
			for _, p := range rule.HTTP.Paths {
				b := p.Backend.Service
				if b == nil {
					fail("Ingress %s: a path without a service", in.Name)
					continue
				}
				s := get[corev1.Service](r, "Service", b.Name)
				if s == nil || !slices.ContainsFunc(s.Spec.Ports, func(sp corev1.ServicePort) bool { return sp.Port == b.Port.Number }) {
					fail("Ingress %s: backend %s:%d is no rendered Service port", in.Name, b.Name, b.Port.Number)
				}
			}
		}
	}
	for _, m := range all[serviceMonitor](r) {
		for _, e := range m.Spec.Endpoints {
			found := false
			for _, s := range all[corev1.Service](r) {
				if selects(m.Spec.Selector.MatchLabels, s.Labels) &&
					slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == e.Port }) {
					found = true
				}
			}
			if !found {
				fail("ServiceMonitor %s: no selected Service has a port %q", m.Name, e.Port)
			}
		}
	}
	for key, o := range r.objects {
		ns, _, labels := meta(o)
		if ns != namespace {
			fail("%s is in namespace %q, want the release's %q", key, ns, namespace)
		}
		if labels[nameLabel] != "aenv" {
			fail("%s lacks the label %s=aenv", key, nameLabel)
		}
	}
	return errors.Join(errs...)
}

// selected is the workloads whose pods selector matches.
func (r *rendered) selected(selector map[string]string) []workload {
	var ws []workload
	for _, w := range r.workloads() {
		if selects(selector, w.template.Labels) {
			ws = append(ws, w)
		}
	}
	return ws
}

func container(pod corev1.PodSpec) corev1.Container {
	if len(pod.Containers) != 1 {
		return corev1.Container{}
	}
	return pod.Containers[0]
}

func env(pod corev1.PodSpec, name string) *corev1.EnvVar {
	for _, e := range container(pod).Env {
		if e.Name == name {
			return &e
		}
	}
	return nil
}

// secretRef says whether the pod's env var name comes from key of secret.
func secretRef(pod corev1.PodSpec, name, secret, key string) error {
	e := env(pod, name)
	if e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
		return fmt.Errorf("%s is not read from a Secret", name)
	}
	r := e.ValueFrom.SecretKeyRef
	return want(r.Name == secret && r.Key == key, "%s reads key %s of Secret %s, want key %s of %s", name, r.Key, r.Name, key, secret)
}

func envValue(pod corev1.PodSpec, name, value string) error {
	e := env(pod, name)
	if e == nil {
		return fmt.Errorf("%s is not set", name)
	}
	return want(e.ValueFrom == nil && e.Value == value, "%s is %q, want %q", name, e.Value, value)
}

// secretVolume is the secret name of the pod's volume named name.
func secretVolume(pod corev1.PodSpec, name string) string {
	for _, v := range pod.Volumes {
		if v.Name == name && v.Secret != nil {
			return v.Secret.SecretName
		}
	}
	return ""
}

func want(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf(format, args...)
}
