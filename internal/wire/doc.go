// The types of the control plane's JSON, generated from the OpenAPI
// document api/openapi/aenv.yaml: the server (internal/api), the Go client
// (internal/client) and the gateway use these, so that a shape is declared
// once. Change the document, then run `make generate`.

//go:generate go run github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2 -config ../../api/openapi/oapi-codegen.yaml ../../api/openapi/aenv.yaml

package wire
