package dockerfile

import (
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	run := func(line int, cmd string) Step { return Step{Type: StepRun, Args: []string{cmd}, Line: line} }
	tests := []struct {
		name      string
		text      string
		buildArgs map[string]string
		want      *Plan
	}{
		{
			name: "every supported instruction",
			text: `# syntax=docker/dockerfile:1
FROM ubuntu:22.04
# a comment
ENV APP_HOME=/opt/app GREETING="hello world"
WORKDIR $APP_HOME
RUN apt-get update && \
    # comments inside a continuation go
    apt-get install -y curl
COPY --chown=user --chmod=0644 hello.txt ./
ADD site/ ${APP_HOME}/site/
USER user
CMD ["python3", "-m", "http.server", "8080"]
`,
			want: &Plan{From: "ubuntu:22.04", StartCmd: "python3 -m http.server 8080", Steps: []Step{
				{Type: StepEnv, Args: []string{"APP_HOME", "/opt/app", "GREETING", "hello world"}, Line: 4},
				{Type: StepWorkdir, Args: []string{"/opt/app"}, Line: 5},
				run(6, "apt-get update &&     apt-get install -y curl"),
				{Type: StepCopy, Args: []string{"hello.txt", "./", "user", "0644"}, Line: 9},
				{Type: StepCopy, Args: []string{"site", "/opt/app/site/", "", ""}, Line: 10},
				{Type: StepUser, Args: []string{"user"}, Line: 11},
			}},
		},
		{
			name: "ARG: build-arg over default; RUN sees it, the template keeps no ENV for it",
			text: `ARG BASE=base
FROM ${BASE}
ARG VERSION=1.0
ARG NAME
RUN echo $VERSION
COPY app-${VERSION}.txt /opt/
`,
			buildArgs: map[string]string{"VERSION": "2.0", "BASE": "python:3.12"},
			want: &Plan{From: "python:3.12", Steps: []Step{
				run(5, "export VERSION=2.0 NAME=''; echo $VERSION"),
				{Type: StepCopy, Args: []string{"app-2.0.txt", "/opt/", "", ""}, Line: 6},
			}},
		},
		{
			name: "ENV shadows ARG; the old ENV form; quotes and escapes",
			text: `FROM base
ARG X=from-arg
ENV X from env
ENV Y='$X' Z="${X:-none}/b" W=a\ b
RUN true
`,
			want: &Plan{From: "base", Steps: []Step{
				{Type: StepEnv, Args: []string{"X", "from env"}, Line: 3},
				{Type: StepEnv, Args: []string{"Y", "$X", "Z", "from env/b", "W", "a b"}, Line: 4},
				run(5, "true"),
			}},
		},
		{
			name: "ENTRYPOINT and CMD together, several sources, single-stage AS",
			text: "FROM base AS app\nCOPY a.txt b/*.py /app/\nENTRYPOINT [\"python3\", \"-u\"]\nCMD [\"app.py\", \"it's\"]\n",
			want: &Plan{From: "base", StartCmd: `python3 -u app.py 'it'\''s'`, Steps: []Step{
				{Type: StepCopy, Args: []string{"a.txt", "/app/", "", ""}, Line: 2},
				{Type: StepCopy, Args: []string{"b/*.py", "/app/", "", ""}, Line: 2},
			}},
		},
		{
			name: "a later ENTRYPOINT resets CMD; shell forms; exec-form RUN; ignored metadata",
			text: "FROM base\nCMD echo old\nENTRYPOINT exec server --port 1\nRUN [\"touch\", \"/a b\"]\nEXPOSE 80\n",
			want: &Plan{From: "base", StartCmd: "exec server --port 1", Steps: []Step{run(4, "touch '/a b'")},
				Warnings: []string{"line 5: EXPOSE has no effect on a sandbox template; ignored"}},
		},
		{
			name: "escape directive; paths cleaned to the context",
			text: "# escape=`\nFROM base\nRUN echo a `\n  b\nCOPY /etc/../x ./\n",
			want: &Plan{From: "base", Steps: []Step{run(3, "echo a   b"),
				{Type: StepCopy, Args: []string{"x", "./", "", ""}, Line: 5}}},
		},
		{
			name:      "unused build arguments are named",
			text:      "FROM base\n",
			buildArgs: map[string]string{"NOPE": "1"},
			want:      &Plan{From: "base", Warnings: []string{"build arguments not declared by ARG: NOPE"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.text, tt.buildArgs)
			if err != nil {
				t.Fatal(err)
			}
			// The frame of user and workdir steps has its own test.
			got.Steps = dockerfileSteps(got.Steps)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// dockerfileSteps drops the steps Parse adds (they have no line).
func dockerfileSteps(steps []Step) []Step {
	var out []Step
	for _, st := range steps {
		if st.Line != 0 {
			out = append(out, st)
		}
	}
	return out
}

// Like Docker, a Dockerfile runs as root in / until USER and WORKDIR say
// otherwise; the template gets E2B's user and /home/user only for what the
// Dockerfile never set (as E2B's fromDockerfile does).
func TestParseUserAndWorkdir(t *testing.T) {
	user := func(u string, line int) Step { return Step{Type: StepUser, Args: []string{u}, Line: line} }
	workdir := func(d string, line int) Step { return Step{Type: StepWorkdir, Args: []string{d}, Line: line} }
	run := func(cmd string, line int) Step { return Step{Type: StepRun, Args: []string{cmd}, Line: line} }
	tests := []struct {
		name string
		text string
		want []Step
	}{
		{"neither set", "FROM base\nRUN echo x > /f\n",
			[]Step{user("root", 0), workdir("/", 0), run("echo x > /f", 2), user("user", 0), workdir("/home/user", 0)}},
		{"both set", "FROM base\nUSER app\nWORKDIR /srv\nRUN true\n",
			[]Step{user("root", 0), workdir("/", 0), user("app", 2), workdir("/srv", 3), run("true", 4)}},
		{"only USER", "FROM base\nUSER root\nRUN apt-get install -y curl\n",
			[]Step{user("root", 0), workdir("/", 0), user("root", 2), run("apt-get install -y curl", 3), workdir("/home/user", 0)}},
		{"only WORKDIR", "FROM base\nWORKDIR app\n",
			[]Step{user("root", 0), workdir("/", 0), workdir("app", 2), user("user", 0)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.text, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Steps, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got.Steps, tt.want)
			}
		})
	}
}

func TestParseRefuses(t *testing.T) {
	tests := []struct{ name, text, want string }{
		{"no FROM", "RUN true\n", "line 1: RUN: only ARG may come before FROM"},
		{"empty", "# nothing\n", "no FROM"},
		{"multi-stage", "FROM a AS build\nRUN make\nFROM b\n", "line 3: FROM: multi-stage builds are not supported"},
		{"COPY --from", "FROM base\nCOPY --from=build /out /app\n", "line 2: COPY: --from is not supported"},
		{"HEALTHCHECK", "FROM base\nHEALTHCHECK CMD curl -f localhost\n", "line 2: HEALTHCHECK: not supported"},
		{"SHELL", "FROM base\nSHELL [\"/bin/zsh\", \"-c\"]\n", "line 2: SHELL: not supported"},
		{"unknown", "FROM base\nFROB x\n", "line 2: FROB: unknown instruction"},
		{"RUN --mount", "FROM base\nRUN --mount=type=cache,target=/x make\n", "line 2: RUN: flag --mount=type=cache,target=/x is not supported"},
		{"heredoc", "FROM base\nRUN <<EOF\n", "line 2: RUN: heredocs are not supported"},
		{"remote ADD", "FROM base\nADD https://example.com/x /x\n", "remote source"},
		{"ADD archive", "FROM base\nADD app.tar.gz /app/\n", "unpacking is not supported"},
		{"outside the context", "FROM base\nCOPY ../secret /x\n", "leaves the build context"},
		{"several sources, file destination", "FROM base\nCOPY a b /dest\n", "must end in /"},
		{"symbolic chmod", "FROM base\nCOPY --chmod=u+x a /a\n", "only octal modes"},
		{"USER with group", "FROM base\nUSER app:app\n", "USER with a group"},
		{"scratch", "FROM scratch\n", "FROM scratch is not supported"},
		{"platform", "FROM --platform=linux/arm64 base\n", "flag --platform=linux/arm64 is not supported"},
		{"bad substitution", "FROM base\nENV A=${B?x}\n", "line 2: ENV:"},
		{"unterminated quote", "FROM base\nENV A=\"x\n", "unterminated double quote"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.text, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
