package clientcmd

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
)

// TestEscrowText: what a replica's leases hold, in words, with its demand
// and fair share ("-" when it has none).
func TestEscrowText(t *testing.T) {
	at := time.Date(2030, 6, 1, 21, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		h    *charonv1.EscrowHolding
		want string
	}{
		{"two leases, a fair share",
			&charonv1.EscrowHolding{Leases: 2, Held: 120, Granted: 40, Until: timestamppb.New(at.Add(800 * time.Millisecond)), Rate: 512.4, Demand: 500, Share: 333},
			"120 held in 2 leases, 40 granted, until 2030-06-01T21:00:00.8Z (in 800ms); demand 500, share 333 per window; 512 decisions/s"},
		{"sized by demand", &charonv1.EscrowHolding{Leases: 1, Held: 9, Granted: 1, Rate: 60, Demand: 70, Share: -1},
			"9 held in 1 lease, 1 granted; demand 70, share - per window; 60 decisions/s"},
		{"no live lease", &charonv1.EscrowHolding{Rate: 50, Share: -1}, "no live lease; demand 0, share - per window; 50 decisions/s"},
	} {
		if got := escrowText(tc.h, at); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestPrintEscrow: usage prints, in its last column, what this replica's
// leases hold of a leased key ("-" for one not leased); explain prints it
// on a line of its own.
func TestPrintEscrow(t *testing.T) {
	at := time.Date(2030, 6, 1, 21, 0, 0, 0, time.UTC)
	h := &charonv1.EscrowHolding{Leases: 1, Held: 90, Granted: 10, Until: timestamppb.New(at.Add(time.Second)), Rate: 100, Demand: 150, Share: 400}
	descs := [][]*charonv1.Entry{{{Key: "tenant", Value: "acme"}}, {{Key: "tenant", Value: "cold"}}}
	var out bytes.Buffer
	printUsage(&out, descs, &charonv1.UsageResponse{At: timestamppb.New(at), Limits: []*charonv1.UsageLimit{
		{DescriptorIndex: 0, Kind: "rate", Period: "tiers, 1m0s", Limit: 1000, Used: 300, Remaining: 700, Escrow: h},
		{DescriptorIndex: 1, Kind: "rate", Period: "tiers, 1m0s", Limit: 1000, Used: 3, Remaining: 997},
	}})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("usage printed %d lines, want 3:\n%s", len(lines), out.String())
	}
	for _, c := range []struct{ line, suffix string }{
		{lines[0], "escrow on this replica"},
		{lines[1], "90 held in 1 lease, 10 granted, until 2030-06-01T21:00:01Z (in 1s); demand 150, share 400 per window; 100 decisions/s"},
		{lines[2], " -"},
	} {
		if !strings.HasSuffix(c.line, c.suffix) {
			t.Errorf("usage line %q does not end with %q", c.line, c.suffix)
		}
	}
	out.Reset()
	printExplanation(&out, "tenant=acme", &charonv1.Explanation{Limited: true, Kind: "tiers", Summary: "300 of 1000 used", Escrow: h}, at)
	if want := "  escrow    in escrow on this replica: 90 held in 1 lease, 10 granted"; !strings.Contains(out.String(), want) {
		t.Errorf("explain printed\n%s\nwithout %q", out.String(), want)
	}
	out.Reset()
	printExplanation(&out, "tenant=cold", &charonv1.Explanation{Limited: true, Kind: "tiers", Summary: "3 of 1000 used"}, at)
	if strings.Contains(out.String(), "escrow") {
		t.Errorf("explain of a key not in escrow printed\n%s", out.String())
	}
}
