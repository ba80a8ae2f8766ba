package config

import (
	"testing"

	"github.com/spf13/pflag"
)

// The tracing flags of server, node and gateway: off by default, taken
// from AENV_* variables, and checked.
func TestTracingFlags(t *testing.T) {
	for _, tc := range []struct {
		name     string
		env      map[string]string
		args     []string
		endpoint string
		ratio    float64
		ok       bool
	}{
		{name: "off by default", ratio: 1, ok: true},
		{name: "flags", args: []string{"--otlp-endpoint", "http://collector:4318", "--trace-sample-ratio", "0.1"},
			endpoint: "http://collector:4318", ratio: 0.1, ok: true},
		{name: "variables", env: map[string]string{"AENV_OTLP_ENDPOINT": "https://c.example/otlp", "AENV_TRACE_SAMPLE_RATIO": "0.5"},
			endpoint: "https://c.example/otlp", ratio: 0.5, ok: true},
		{name: "endpoint without scheme", args: []string{"--otlp-endpoint", "collector:4318"},
			endpoint: "collector:4318", ratio: 1},
		{name: "ratio above 1", args: []string{"--otlp-endpoint", "http://collector:4318", "--trace-sample-ratio", "2"},
			endpoint: "http://collector:4318", ratio: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			server, gateway := Default(), DefaultGateway()
			for _, c := range []struct {
				register func(*pflag.FlagSet)
				tracing  *Tracing
				validate func() error
			}{
				{server.RegisterFlags, &server.Tracing, server.Validate},
				{gateway.RegisterFlags, &gateway.Tracing, func() error { return gateway.Tracing.validate() }},
			} {
				fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
				c.register(fs)
				if err := fs.Parse(tc.args); err != nil {
					t.Fatal(err)
				}
				if c.tracing.OTLPEndpoint != tc.endpoint || c.tracing.SampleRatio != tc.ratio {
					t.Errorf("tracing = %+v, want %q %v", *c.tracing, tc.endpoint, tc.ratio)
				}
				if err := c.validate(); (err == nil) != tc.ok {
					t.Errorf("Validate = %v, want ok=%v", err, tc.ok)
				}
			}
		})
	}
}
