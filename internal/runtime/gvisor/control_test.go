package gvisor

import (
	"encoding/json"
	"os"
	"reflect"
	"testing"

	"gvisor.dev/gvisor/pkg/sentry/control"
	"gvisor.dev/gvisor/pkg/state/statefile"
	"gvisor.dev/gvisor/pkg/urpc"
)

// TestSaveOptsWire: the checkpoint argument the driver sends decodes, as
// the sandbox's control server decodes it (urpc carries JSON), into
// gVisor's control.SaveOpts with the values runsc checkpoint would send
// for an uncompressed local image, left running or not.
func TestSaveOptsWire(t *testing.T) {
	for _, resume := range []bool{false, true} {
		sent := saveOpts{
			Metadata:      statefile.CompressionLevelNone.ToMetadata(),
			HavePagesFile: true,
			FilePayload:   urpc.FilePayload{Files: []*os.File{os.Stdin}},
			Resume:        resume,
		}
		b, err := json.Marshal(&sent)
		if err != nil {
			t.Fatal(err)
		}
		var got control.SaveOpts
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
		want := control.SaveOpts{
			Metadata:      map[string]string{"compression": string(statefile.CompressionLevelNone)},
			HavePagesFile: true,
			Resume:        resume,
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s decodes to %+v, want %+v", b, got, want)
		}
	}
}
