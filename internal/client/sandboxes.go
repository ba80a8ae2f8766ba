package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Sandbox is what create, fork, get and list answer (E2B's Sandbox and
// ListedSandbox; each answer fills its own subset).
type Sandbox struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	State           string            `json:"state"`
	Metadata        map[string]string `json:"metadata"`
	// Unresponsive says why a running sandbox is not answering; "" while
	// it answers.
	Unresponsive string `json:"unresponsive"`
	// VolumeMounts are the volumes the sandbox mounts (get and list).
	VolumeMounts []VolumeMount `json:"volumeMounts"`

	// Raw is the object as the server sent it.
	Raw json.RawMessage `json:"-"`
}

// CreateSandboxRequest is the body of POST /sandboxes.
type CreateSandboxRequest struct {
	TemplateID string            `json:"templateID"`
	VCPU       int               `json:"vcpu,omitempty"`
	MemoryMB   int               `json:"memoryMB,omitempty"`
	Timeout    int               `json:"timeout,omitempty"` // seconds
	Metadata   map[string]string `json:"metadata,omitempty"`
	EnvVars    map[string]string `json:"envVars,omitempty"`
	AutoPause  bool              `json:"autoPause,omitempty"` // pause instead of kill at the deadline
	// VolumeMounts are the volumes to mount, by name or ID.
	VolumeMounts []VolumeMount `json:"volumeMounts,omitempty"`
}

// VolumeMount mounts a volume into a sandbox (E2B's shape; ReadOnly is
// aenv's).
type VolumeMount struct {
	Name     string `json:"name"` // the volume's name or ID
	Path     string `json:"path"` // absolute, inside the sandbox
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// CreateSandbox creates a sandbox; it answers once envd in it answers.
func (c *Client) CreateSandbox(ctx context.Context, req CreateSandboxRequest) (Sandbox, error) {
	var raw json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodPost, "/sandboxes", nil, req, &raw); err != nil {
		return Sandbox{}, err
	}
	return decodeSandbox("create sandbox", raw)
}

func decodeSandbox(op string, raw json.RawMessage) (Sandbox, error) {
	var sb Sandbox
	if err := json.Unmarshal(raw, &sb); err != nil {
		return Sandbox{}, fmt.Errorf("%s: decode answer: %w", op, err)
	}
	if sb.SandboxID == "" {
		return Sandbox{}, fmt.Errorf("%s: the answer has no sandboxID", op)
	}
	sb.Raw = raw
	return sb, nil
}

// GetSandbox returns one sandbox, with its envd access token.
func (c *Client) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	var raw json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodGet, sandboxPath(id), nil, nil, &raw); err != nil {
		return Sandbox{}, err
	}
	return decodeSandbox("get sandbox", raw)
}

// ListSandboxes follows X-Next-Token through every page. state is a
// comma-separated list of states ("" is the server's default, running
// and paused).
func (c *Client) ListSandboxes(ctx context.Context, state string) ([]Sandbox, error) {
	var all []Sandbox
	token := ""
	for {
		q := url.Values{"limit": {"100"}}
		if state != "" {
			q.Set("state", state)
		}
		if token != "" {
			q.Set("nextToken", token)
		}
		page, header, err := getList(ctx, c, "/v2/sandboxes", q, func(sb *Sandbox, raw json.RawMessage) { sb.Raw = raw })
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		token = header.Get("X-Next-Token")
		if token == "" || len(page) == 0 {
			return all, nil
		}
	}
}

// DeleteSandbox kills a sandbox and removes everything it had.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	_, err := c.DoJSON(ctx, http.MethodDelete, sandboxPath(id), nil, nil, nil)
	return err
}

// SetTimeout moves the sandbox's deadline to secs from now.
func (c *Client) SetTimeout(ctx context.Context, id string, secs int) error {
	_, err := c.DoJSON(ctx, http.MethodPost, sandboxPath(id, "timeout"), nil, map[string]int{"timeout": secs}, nil)
	return err
}

// PauseRequest is the body of POST /sandboxes/{id}/pause; the zero value
// keeps memory, as E2B's pause does.
type PauseRequest struct {
	// DropMemory keeps only the files (E2B's keepMemory: false).
	DropMemory bool
	// ToDisk writes the memory to disk at once and releases it.
	ToDisk bool
}

// Pause stops a sandbox's processes; the server keeps its state.
func (c *Client) Pause(ctx context.Context, id string, req PauseRequest) error {
	var body any // none: E2B's SDK sends none
	if req.DropMemory || req.ToDisk {
		opts := map[string]bool{}
		if req.DropMemory {
			opts["memory"] = false
		}
		if req.ToDisk {
			opts["toDisk"] = true
		}
		body = opts
	}
	_, err := c.DoJSON(ctx, http.MethodPost, sandboxPath(id, "pause"), nil, body, nil)
	return err
}

// Resume continues a paused sandbox; timeoutSecs > 0 sets a new lifetime.
func (c *Client) Resume(ctx context.Context, id string, timeoutSecs int) error {
	body := map[string]int{}
	if timeoutSecs > 0 {
		body["timeout"] = timeoutSecs
	}
	_, err := c.DoJSON(ctx, http.MethodPost, sandboxPath(id, "resume"), nil, body, nil)
	return err
}

// ForkResult is one child of a fork: a sandbox, or why it failed.
type ForkResult struct {
	Sandbox *Sandbox     `json:"sandbox"`
	Error   *ErrorObject `json:"error"`

	Raw json.RawMessage `json:"-"`
}

// Fork makes count children of a running or paused sandbox. Children that
// failed come back with Error set; the others are usable.
// Each child gets its own copy-on-write copy of the volumes mounted at
// copyVolumes, and shares the others.
func (c *Client) Fork(ctx context.Context, id string, count int, copyVolumes ...string) ([]ForkResult, error) {
	return c.fork(ctx, sandboxPath(id, "fork"), forkBody(count, copyVolumes))
}

// ForkSnapshot makes count sandboxes from a snapshot or template (by ID
// or name), each continuing from its memory. Each gets its own
// copy-on-write copy of the volumes the snapshot mounts at copyVolumes, as
// they are now, and shares the others.
func (c *Client) ForkSnapshot(ctx context.Context, ref string, count int, copyVolumes ...string) ([]ForkResult, error) {
	return c.fork(ctx, "/snapshots/"+url.PathEscape(ref)+"/fork", forkBody(count, copyVolumes))
}

// forkBody is a fork's request: count children, copies of the volumes
// mounted at copyVolumes.
func forkBody(count int, copyVolumes []string) map[string]any {
	body := map[string]any{"count": count}
	if len(copyVolumes) > 0 {
		modes := map[string]string{}
		for _, p := range copyVolumes {
			modes[p] = "copy"
		}
		body["volumes"] = modes
	}
	return body
}

func (c *Client) fork(ctx context.Context, path string, body map[string]any) ([]ForkResult, error) {
	var raws []json.RawMessage
	if _, err := c.DoJSON(ctx, http.MethodPost, path, nil, body, &raws); err != nil {
		return nil, err
	}
	out := make([]ForkResult, 0, len(raws))
	for _, raw := range raws {
		var r ForkResult
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, fmt.Errorf("fork: decode answer: %w", err)
		}
		if r.Sandbox != nil && r.Sandbox.SandboxID == "" {
			r.Sandbox = nil
		}
		if r.Sandbox == nil && r.Error == nil {
			r.Error = &ErrorObject{Message: "the server sent neither a sandbox nor an error"}
		}
		r.Raw = raw
		out = append(out, r)
	}
	return out, nil
}

// ForkErrors splits fork results into the children made and the errors
// of those that were not.
func ForkErrors(results []ForkResult) ([]Sandbox, []error) {
	var children []Sandbox
	var errs []error
	for _, r := range results {
		if r.Sandbox != nil {
			children = append(children, *r.Sandbox)
			continue
		}
		errs = append(errs, fmt.Errorf("fork child: %w", r.Error.Err()))
	}
	return children, errs
}

// ExecuteRequest is the body of POST /sandboxes/{id}/execute.
type ExecuteRequest struct {
	Command string            `json:"command"`
	Cwd     string            `json:"cwd,omitempty"`
	Envs    map[string]string `json:"envs,omitempty"`
	User    string            `json:"user,omitempty"`
	Timeout float64           `json:"timeout,omitempty"` // seconds; 0 is the server's default
}

// ExecuteResult is how a command ended and what it printed.
type ExecuteResult struct {
	ExitCode  int    `json:"exitCode"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	TimedOut  bool   `json:"timedOut"`
	Truncated bool   `json:"truncated"`
}

// Execute runs a shell command to completion. A non-zero exit is a
// result, not an error.
func (c *Client) Execute(ctx context.Context, id string, req ExecuteRequest) (ExecuteResult, error) {
	var res ExecuteResult
	_, err := c.DoJSON(ctx, http.MethodPost, sandboxPath(id, "execute"), nil, req, &res)
	return res, err
}

// Metric is one sample of a sandbox's resource use.
type Metric struct {
	Timestamp  time.Time `json:"timestamp"`
	CPUCount   int       `json:"cpuCount"`
	CPUUsedPct float64   `json:"cpuUsedPct"`
	MemUsed    int64     `json:"memUsed"`
	MemTotal   int64     `json:"memTotal"`
}

// Metrics returns the sandbox's recent resource samples, oldest first.
func (c *Client) Metrics(ctx context.Context, id string) ([]Metric, error) {
	var out []Metric
	_, err := c.DoJSON(ctx, http.MethodGet, sandboxPath(id, "metrics"), nil, nil, &out)
	return out, err
}

// NetworkPolicy is a sandbox's egress policy (PUT /sandboxes/{id}/network).
type NetworkPolicy struct {
	AllowInternetAccess *bool    `json:"allowInternetAccess,omitempty"`
	AllowOut            []string `json:"allowOut,omitempty"`
	DenyOut             []string `json:"denyOut,omitempty"`
}

// UpdateNetwork replaces the sandbox's egress policy.
func (c *Client) UpdateNetwork(ctx context.Context, id string, policy NetworkPolicy) error {
	_, err := c.DoJSON(ctx, http.MethodPut, sandboxPath(id, "network"), nil, policy, nil)
	return err
}

// Health reports whether the server answers GET /health.
func (c *Client) Health(ctx context.Context) error {
	_, err := c.DoJSON(ctx, http.MethodGet, "/health", nil, nil, nil)
	return err
}
