// Package openapi holds the OpenAPI document of aenv's control plane
// (aenv.yaml), embedded so that the server can serve it and tests can
// validate answers against it.
package openapi

import _ "embed"

// Document is the OpenAPI 3 document, YAML.
//
//go:embed aenv.yaml
var Document []byte
