package config

import (
	"github.com/spf13/pflag"

	"github.com/aenv-dev/aenv/internal/tracing"
)

// Tracing is where a process sends OpenTelemetry traces of its creates,
// forks and resumes (off without an endpoint).
type Tracing struct {
	OTLPEndpoint string
	SampleRatio  float64
}

// DefaultTracing keeps every trace once an endpoint is given.
func DefaultTracing() Tracing { return Tracing{SampleRatio: 1} }

func (t *Tracing) register(fs *pflag.FlagSet) {
	fs.StringVar(&t.OTLPEndpoint, "otlp-endpoint", envString("otlp-endpoint", t.OTLPEndpoint),
		"base URL of an OTLP/HTTP collector to send traces of creates, forks, resumes and background work (pools, deadlines) to, e.g. http://otel-collector:4318 (empty: OTEL_EXPORTER_OTLP_ENDPOINT when set, else tracing is off)"+envHint("otlp-endpoint"))
	fs.Float64Var(&t.SampleRatio, "trace-sample-ratio", envFloat("trace-sample-ratio", t.SampleRatio),
		"share of the traces begun here that are kept, 0 to 1 (a request that comes with a trace keeps its caller's choice)"+envHint("trace-sample-ratio"))
}

// Config is what package tracing needs for the process service, of
// release version.
func (t Tracing) Config(service, version string) tracing.Config {
	return tracing.Config{Endpoint: t.OTLPEndpoint, SampleRatio: t.SampleRatio, Service: service, Version: version}
}

func (t Tracing) validate() error {
	return t.Config("", "").Validate()
}
