package wire_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/aenv-dev/aenv/internal/wire/wiretest"
)

// wire.gen.go must be regenerated whenever api/openapi/aenv.yaml changes
// (make generate). Regenerating needs the generator from the module proxy,
// so this test checks the result instead: every object schema of the
// document has a struct here, and its JSON fields are exactly the schema's
// properties (with allOf flattened, as the generator does).
func TestGeneratedTypesMatchDocument(t *testing.T) {
	doc := wiretest.Document(t)
	structs := generatedStructs(t)
	for name, ref := range doc.Components.Schemas {
		props := properties(ref.Value)
		if len(props) == 0 {
			continue // enums and other non-objects
		}
		fields, ok := structs[name]
		if !ok {
			t.Errorf("schema %s has no type in wire.gen.go: run make generate", name)
			continue
		}
		sort.Strings(props)
		sort.Strings(fields)
		if !reflect.DeepEqual(props, fields) {
			t.Errorf("schema %s has properties %v, its type fields %v: run make generate", name, props, fields)
		}
	}
}

func properties(s *openapi3.Schema) []string {
	var out []string
	for name := range s.Properties {
		out = append(out, name)
	}
	for _, part := range s.AllOf {
		out = append(out, properties(part.Value)...)
	}
	return out
}

// generatedStructs maps each struct type of wire.gen.go to its JSON names.
func generatedStructs(t *testing.T) map[string][]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "wire.gen.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, decl := range f.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok || gen.Tok != token.TYPE {
			continue
		}
		for _, spec := range gen.Specs {
			ts := spec.(*ast.TypeSpec)
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				continue
			}
			var names []string
			for _, field := range st.Fields.List {
				if field.Tag == nil {
					continue
				}
				tag := reflect.StructTag(strings.Trim(field.Tag.Value, "`")).Get("json")
				if name, _, _ := strings.Cut(tag, ","); name != "" && name != "-" {
					names = append(names, name)
				}
			}
			out[ts.Name.Name] = names
		}
	}
	return out
}
