package offlinecmd

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/charonlimit/charon/internal/clientcmd"
	"github.com/charonlimit/charon/internal/escrowsim"
)

// TestEscrowSimVerb: the verb runs a simulation of its flags and prints it
// as JSON, a window per row, with every replica; a bad flag is a usage
// error naming it, before any run.
func TestEscrowSimVerb(t *testing.T) {
	if testing.Short() {
		t.Skip("runs in real time")
	}
	var out, errb bytes.Buffer
	err := EscrowSim([]string{"--json", "--duration", "2s", "--limit", "50", "--replicas", "2", "--regions", "2",
		"--shift", "1s", "--kill", "0", "--cut", "0"}, &out, &errb)
	if err != nil {
		t.Fatalf("escrow-sim: %v\n%s", err, errb.String())
	}
	var res escrowsim.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("the JSON: %v\n%s", err, out.String())
	}
	if res.Limit != 50 || len(res.Rows) != 2 || len(res.Rows[0].Replicas) != 2 {
		t.Errorf("limit %d, %d windows, %d replicas: want 50, 2, 2", res.Limit, len(res.Rows), len(res.Rows[0].Replicas))
	}
	if res.Summary.OverGrants != 0 || res.Summary.Requests == 0 {
		t.Errorf("over-grants %d of %d requests: want 0 of some", res.Summary.OverGrants, res.Summary.Requests)
	}
	// Two regions, --latency not given: 80 ms each way and back.
	if res.Summary.P50 < 80 && res.Summary.Local < 0.5 {
		t.Errorf("p50 %v ms with %.0f%% decided locally: the default round trip of two regions did not apply", res.Summary.P50, 100*res.Summary.Local)
	}

	for _, args := range [][]string{{"--regions", "4"}, {"--rate", "0"}, {"--cut-region", "3"}} {
		out.Reset()
		errb.Reset()
		err := EscrowSim(args, &out, &errb)
		if !errors.Is(err, clientcmd.ErrUsage) || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("escrow-sim %v: %v, want a usage error naming %s", args, err, args[0])
		}
	}
}
