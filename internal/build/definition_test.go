package build

import (
	"encoding/json"
	"strings"
	"testing"
)

const hashA = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		spec    string
		base    Base
		wantErr string
	}{
		{"sdk default base", `{"fromImage":"e2bdev/base","steps":[]}`, Base{Template: "base"}, ""},
		{"base with tag and registry", `{"fromImage":"docker.io/e2bdev/base:latest"}`, Base{Template: "base"}, ""},
		{"no base at all", `{}`, Base{Template: "base"}, ""},
		{"other image", `{"fromImage":"python:3.12"}`, Base{Image: "python:3.12"}, ""},
		{"template", `{"fromTemplate":"my-env"}`, Base{Template: "my-env"}, ""},
		{"both", `{"fromImage":"x","fromTemplate":"y"}`, Base{}, "exactly one"},
		{"registry credentials", `{"fromImage":"x","fromImageRegistry":{"type":"registry"}}`, Base{}, "not supported"},
		{"bad template name", `{"fromTemplate":"a/b"}`, Base{}, "fromTemplate"},
		{"every step kind", `{"steps":[
			{"type":"RUN","args":["echo hi","root"]},
			{"type":"COPY","args":["dir","/app/","user","0644"],"filesHash":"` + hashA + `"},
			{"type":"ENV","args":["A","1","B","2"]},
			{"type":"WORKDIR","args":["/app"]},
			{"type":"USER","args":["user"]}]}`, Base{Template: "base"}, ""},
		{"empty run", `{"steps":[{"type":"RUN","args":[" "]}]}`, Base{}, "step 1 (RUN)"},
		{"copy without hash", `{"steps":[{"type":"COPY","args":["a","/b"]}]}`, Base{}, "filesHash"},
		{"copy upper-case hash", `{"steps":[{"type":"COPY","args":["a","/b"],"filesHash":"` + strings.ToUpper(hashA) + `"}]}`, Base{}, "filesHash"},
		{"copy escapes", `{"steps":[{"type":"COPY","args":["../etc","/b"],"filesHash":"` + hashA + `"}]}`, Base{}, "inside the context"},
		{"copy absolute", `{"steps":[{"type":"COPY","args":["/etc","/b"],"filesHash":"` + hashA + `"}]}`, Base{}, "relative"},
		{"copy bad mode", `{"steps":[{"type":"COPY","args":["a","/b","","0999"],"filesHash":"` + hashA + `"}]}`, Base{}, "octal"},
		{"env odd", `{"steps":[{"type":"ENV","args":["A"]}]}`, Base{}, "pairs"},
		{"env bad name", `{"steps":[{"type":"ENV","args":["A=B","1"]}]}`, Base{}, "variable name"},
		{"workdir two args", `{"steps":[{"type":"WORKDIR","args":["/a","/b"]}]}`, Base{}, "one argument"},
		{"unknown type", `{"steps":[{"type":"ADD","args":["x"]}]}`, Base{}, "step 1 (ADD): unsupported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var spec Spec
			if err := json.Unmarshal([]byte(tt.spec), &spec); err != nil {
				t.Fatal(err)
			}
			base, err := spec.Validate()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if base != tt.base {
				t.Fatalf("base = %+v, want %+v", base, tt.base)
			}
		})
	}
}

func TestKeys(t *testing.T) {
	spec := func(mut func(*Spec)) Spec {
		s := Spec{StartCmd: "serve", ReadyCmd: "check", Steps: []Step{
			{Type: StepRun, Args: []string{"echo one"}},
			{Type: StepCopy, Args: []string{"a", "/b", "", ""}, FilesHash: hashA},
			{Type: StepEnv, Args: []string{"K", "V"}},
		}}
		if mut != nil {
			mut(&s)
		}
		return s
	}
	ref := spec(nil)
	refSteps, refFinal := ref.Keys("tpl1")
	if len(refSteps) != 3 {
		t.Fatalf("got %d step keys", len(refSteps))
	}
	tests := []struct {
		name string
		spec Spec
		// parent of the build; "" means tpl1
		parent string
		// firstChanged is the first step whose key differs; -1: none
		// (only the final key may differ), 3: only the final one.
		firstChanged int
		sameFinal    bool
	}{
		{"identical", spec(nil), "", -1, true},
		{"force does not change keys", spec(func(s *Spec) { s.Force = true; s.Steps[0].Force = true }), "", -1, true},
		{"other base", spec(nil), "tpl2", 0, false},
		{"changed command", spec(func(s *Spec) { s.Steps[0].Args[0] = "echo two" }), "", 0, false},
		{"changed files", spec(func(s *Spec) { s.Steps[1].FilesHash = strings.Repeat("0", 64) }), "", 1, false},
		{"changed env", spec(func(s *Spec) { s.Steps[2].Args[1] = "W" }), "", 2, false},
		{"run user", spec(func(s *Spec) { s.Steps[0].Args = append(s.Steps[0].Args, "root") }), "", 0, false},
		{"start command", spec(func(s *Spec) { s.StartCmd = "serve2" }), "", 3, false},
		{"ready command", spec(func(s *Spec) { s.ReadyCmd = "check2" }), "", 3, false},
		// Args are length-prefixed: moving text between them changes the key.
		{"arg boundary", spec(func(s *Spec) { s.Steps[2].Args = []string{"KV", ""} }), "", 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent := tt.parent
			if parent == "" {
				parent = "tpl1"
			}
			steps, final := tt.spec.Keys(parent)
			first := -1
			for i := range steps {
				if steps[i] != refSteps[i] {
					first = i
					break
				}
			}
			if first == -1 && final != refFinal {
				first = 3
			}
			if first != tt.firstChanged && !(tt.firstChanged == -1 && first == -1) {
				t.Fatalf("first changed key = %d, want %d", first, tt.firstChanged)
			}
			if (final == refFinal) != tt.sameFinal {
				t.Fatalf("final key same = %v, want %v", final == refFinal, tt.sameFinal)
			}
			// Every key after a change changes too.
			for i := max(first, 0); first >= 0 && i < len(steps); i++ {
				if steps[i] == refSteps[i] {
					t.Fatalf("step %d key unchanged after a change at %d", i, first)
				}
			}
		})
	}
}

func TestForced(t *testing.T) {
	if (&Spec{Steps: []Step{{Type: StepRun}}}).Forced() {
		t.Fatal("plain spec forced")
	}
	if !(&Spec{Force: true}).Forced() || !(&Spec{Steps: []Step{{Type: StepRun, Force: true}}}).Forced() {
		t.Fatal("force not seen")
	}
}

func TestImageTemplateName(t *testing.T) {
	tests := []struct{ ref, want string }{
		{"python:3.12", "image.python:3.12"},
		{"ghcr.io/org/img:v1", "image.ghcr.io_org_img:v1"},
		{"alpine@sha256:" + hashA, "image.alpine_sha256:" + hashA},
	}
	for _, tt := range tests {
		if got := ImageTemplateName(tt.ref); got != tt.want {
			t.Errorf("ImageTemplateName(%q) = %q, want %q", tt.ref, got, tt.want)
		}
	}
	long := ImageTemplateName("registry.example.com/" + strings.Repeat("x", 200) + ":v1")
	if len(long) > 128 || !strings.HasPrefix(long, "image.") {
		t.Errorf("long reference gives %q", long)
	}
}

func TestDescribe(t *testing.T) {
	tests := []struct {
		step Step
		want string
	}{
		{Step{Type: StepRun, Args: []string{"make", "root"}}, "RUN make (as root)"},
		{Step{Type: StepRun, Args: []string{"make"}}, "RUN make"},
		{Step{Type: StepEnv, Args: []string{"A", "1", "B", "2"}}, "ENV A=1 B=2"},
		{Step{Type: StepCopy, Args: []string{"src", "/app/", "", ""}}, "COPY src /app/"},
	}
	for _, tt := range tests {
		if got := tt.step.Describe(); got != tt.want {
			t.Errorf("Describe() = %q, want %q", got, tt.want)
		}
	}
}

func TestStepCacheNames(t *testing.T) {
	key := strings.Repeat("ab", 32)
	name := stepCacheName("my-app", key)
	if name != "my-app.step-"+key[:keyChars] {
		t.Fatalf("name %q", name)
	}
	if !isStepCacheOf(name, "my-app") {
		t.Fatal("own cache entry not recognised")
	}
	for _, other := range []string{
		"my-app", "my-app.step-", "my-app.step-xyz",
		// A cached step of template "my-app.step-…" is not my-app's.
		stepCacheName("my-app.step-"+key[:keyChars], key),
	} {
		if isStepCacheOf(other, "my-app") {
			t.Errorf("%q taken for a cached step of my-app", other)
		}
	}
	if stepCacheName(strings.Repeat("x", 120), key) != "" {
		t.Fatal("over-long name accepted")
	}
}
