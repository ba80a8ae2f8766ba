package helm_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The decoding below is the one deploy/kubernetes's test applies to the raw
// manifests (a test package cannot import another's), with the kinds the
// chart adds.

// kinds maps apiVersion/kind to a constructor of its Kubernetes API type.
// A kind not listed here fails the test: add it with its type.
var kinds = map[string]func() any{
	"v1/Namespace":                            func() any { return &corev1.Namespace{} },
	"v1/ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                               func() any { return &corev1.Secret{} },
	"v1/Service":                              func() any { return &corev1.Service{} },
	"apps/v1/DaemonSet":                       func() any { return &appsv1.DaemonSet{} },
	"apps/v1/Deployment":                      func() any { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget":           func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1/Ingress":            func() any { return &networkingv1.Ingress{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &serviceMonitor{} },
}

// serviceMonitor is the part of the Prometheus Operator's ServiceMonitor
// the chart writes. Its Go types would bring the operator's module into
// aenv's go.mod for one test; the fields here carry the same JSON names, so
// that anything else the template writes fails as an unknown field.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path,omitempty"`
			Interval      string `json:"interval,omitempty"`
			Authorization *struct {
				Type        string                    `json:"type"`
				Credentials *corev1.SecretKeySelector `json:"credentials"`
			} `json:"authorization,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// documentSeparator is a YAML document marker on a line of its own.
var documentSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decodeStrict turns one YAML document into its Kubernetes API type. It
// returns nil for a document with no content (comments only).
func decodeStrict(doc []byte) (any, error) {
	// Strict: a key given twice is an error, not "last one wins".
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, fmt.Errorf("yaml to json: %w", err)
	}
	if string(bytes.TrimSpace(js)) == "null" {
		return nil, nil
	}
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := json.Unmarshal(js, &meta); err != nil {
		return nil, fmt.Errorf("read apiVersion and kind: %w", err)
	}
	newObj, ok := kinds[meta.APIVersion+"/"+meta.Kind]
	if !ok {
		return nil, fmt.Errorf("unknown kind %q of apiVersion %q", meta.Kind, meta.APIVersion)
	}
	obj := newObj()
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		return nil, fmt.Errorf("decode %s: %w", meta.Kind, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("decode %s: data after the object", meta.Kind)
	}
	// encoding/json matches field names without regard to case, and the API
	// server does not: encoding the object again must give back every key
	// and value of the document, spelled the same.
	back, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", meta.Kind, err)
	}
	var in, out any
	if err := json.Unmarshal(js, &in); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(back, &out); err != nil {
		return nil, err
	}
	if err := contained(in, out, meta.Kind); err != nil {
		return nil, err
	}
	return obj, nil
}

// contained reports the first key or value of in that out lacks.
func contained(in, out any, path string) error {
	switch in := in.(type) {
	case map[string]any:
		o, ok := out.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: not kept as an object", path)
		}
		for k, v := range in {
			ov, ok := o[k]
			if !ok {
				return fmt.Errorf("%s.%s: unknown field (mind the case)", path, k)
			}
			if err := contained(v, ov, path+"."+k); err != nil {
				return err
			}
		}
	case []any:
		o, ok := out.([]any)
		if !ok || len(o) != len(in) {
			return fmt.Errorf("%s: not kept as a list of %d", path, len(in))
		}
		for i := range in {
			if err := contained(in[i], o[i], fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	default:
		if !reflect.DeepEqual(in, out) {
			return fmt.Errorf("%s: %v reads back as %v", path, in, out)
		}
	}
	return nil
}
