package helm_test

import (
	"github.com/aenv-dev/aenv/deploy/kubernetes/kubedecode"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The decoding below is the one deploy/kubernetes's test applies to the raw
// manifests (a test package cannot import another's), with the kinds the
// chart adds.

// kinds maps apiVersion/kind to a constructor of its Kubernetes API type.
// A kind not listed here fails the test: add it with its type.
var kinds = kubedecode.Kinds{
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
var documentSeparator = kubedecode.DocumentSeparator

// decodeStrict turns one YAML document into its Kubernetes API type (nil
// for a document with no content), as kubedecode.Strict does.
func decodeStrict(doc []byte) (any, error) { return kubedecode.Strict(doc, kinds) }
