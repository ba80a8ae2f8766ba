// Package kubedecode decodes Kubernetes manifests strictly into their API
// types, without a cluster: the tests of deploy/kubernetes and of the Helm
// chart in deploy/helm check what they would apply with it.
package kubedecode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// Kinds maps apiVersion/kind to a constructor of its API type. A kind not
// listed is an error.
type Kinds map[string]func() any

// DocumentSeparator is a YAML document marker on a line of its own.
var DocumentSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// Strict turns one YAML document into the Kubernetes API type kinds gives
// for its apiVersion and kind, refusing what the API server would not take
// as written: a key given twice, an unknown field, a field spelled with
// another case. It returns nil for a document with no content (comments
// only).
func Strict(doc []byte, kinds Kinds) (any, error) {
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
	// server does not: a key written "hostnetwork" would pass the decoder and
	// then be dropped by the cluster. Encoding the object again must give back
	// every key and value of the document, spelled the same.
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

// Reference is a Secret or ConfigMap a pod reads (Key "" for the whole of
// it), and whether the pod starts without it.
type Reference struct {
	Kind, Name, Key string
	Optional        bool
}

// PodReferences lists the Secrets and ConfigMaps a pod spec reads through
// its containers' environment and its volumes.
func PodReferences(spec corev1.PodSpec) []Reference {
	var out []Reference
	add := func(kind, name, key string, optional *bool) {
		out = append(out, Reference{Kind: kind, Name: name, Key: key, Optional: optional != nil && *optional})
	}
	for _, c := range spec.Containers {
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				continue
			}
			if r := e.ValueFrom.SecretKeyRef; r != nil {
				add("Secret", r.Name, r.Key, r.Optional)
			}
			if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
				add("ConfigMap", r.Name, r.Key, r.Optional)
			}
		}
		for _, e := range c.EnvFrom {
			if r := e.SecretRef; r != nil {
				add("Secret", r.Name, "", r.Optional)
			}
			if r := e.ConfigMapRef; r != nil {
				add("ConfigMap", r.Name, "", r.Optional)
			}
		}
	}
	for _, v := range spec.Volumes {
		if s := v.Secret; s != nil {
			add("Secret", s.SecretName, "", s.Optional)
		}
		if c := v.ConfigMap; c != nil {
			add("ConfigMap", c.Name, "", c.Optional)
		}
	}
	return out
}
