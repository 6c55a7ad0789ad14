package clientcmd

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/offenders"
)

var at = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func rates(end time.Time, last ...uint64) offenders.Rates {
	r := offenders.Rates{Seconds: 5, End: end, Granted: make([]uint64, 4), Rejected: make([]uint64, 4), Shadow: make([]uint64, 4)}
	copy(r.Rejected[4-len(last):], last)
	return r
}

func view(rule string, floor uint64, rates offenders.Rates, items ...offenders.Item) offenders.View {
	var total uint64
	for _, it := range items {
		total += it.Count
	}
	return offenders.View{Rule: offenders.Rule{Domain: "api", Rule: rule, Resource: "api/user"},
		Rejected: offenders.Window{Items: items, Total: total, Floor: floor}, Rates: rates}
}

// TestMergeTop: two replicas' answers merge per rule; a value one replica
// does not list gets that replica's floor as count and error; rates add up
// aligned on their steps.
func TestMergeTop(t *testing.T) {
	a := offenders.Answer{At: at, EpochSeconds: 60, K: 2, Rules: []offenders.View{
		view("api.yaml:3", 10, rates(at, 1, 2, 3), offenders.Item{Value: "alice", Descriptor: "user=alice", Count: 50}, offenders.Item{Value: "bob", Count: 10}),
	}}
	b := offenders.Answer{At: at.Add(time.Second), EpochSeconds: 60, K: 2, Dropped: 1, Rules: []offenders.View{
		view("api.yaml:3", 0, rates(at.Add(5*time.Second), 7), offenders.Item{Value: "alice", Count: 5}, offenders.Item{Value: "carol", Count: 4}),
		view("api.yaml:9", 0, rates(at), offenders.Item{Value: "x", Count: 1}),
	}}
	m := MergeTop(a, b)
	if len(m.Rules) != 2 || m.Dropped != 1 || !m.At.Equal(at.Add(time.Second)) {
		t.Fatalf("merged %+v", m)
	}
	got := m.Rules[0].Rejected
	want := offenders.Window{Total: 69, Floor: 10, Items: []offenders.Item{
		{Value: "alice", Descriptor: "user=alice", Count: 55},
		{Value: "carol", Count: 14, Err: 10},
		{Value: "bob", Count: 10},
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("merged rejections (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]uint64{1, 2, 3, 7}, m.Rules[0].Rates.Rejected); diff != "" {
		t.Errorf("merged rates (-want +got):\n%s", diff)
	}
}

// TestTopOnce: charon top --once asks every replica's /top with the token
// and prints the merged view.
func TestTopOnce(t *testing.T) {
	var seen []string
	replica := func(ans offenders.Answer) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen = append(seen, r.URL.Path+"?"+r.URL.RawQuery+" "+r.Header.Get("Authorization"))
			json.NewEncoder(w).Encode(ans)
		}))
	}
	a := replica(offenders.Answer{At: at, EpochSeconds: 60, K: 32, Rules: []offenders.View{
		view("api.yaml:3", 0, rates(at, 10, 0), offenders.Item{Value: "alice", Descriptor: "user=alice", Count: 50})}})
	defer a.Close()
	b := replica(offenders.Answer{At: at, EpochSeconds: 60, K: 32, Rules: []offenders.View{
		view("api.yaml:3", 0, rates(at, 5, 0), offenders.Item{Value: "alice", Count: 30}, offenders.Item{Value: "bob", Count: 3})}})
	defer b.Close()
	token := t.TempDir() + "/token"
	writeFile(t, token, "s3cret\n")
	var out, errOut bytes.Buffer
	addr := strings.TrimPrefix(a.URL, "http://") + "," + strings.TrimPrefix(b.URL, "http://")
	if err := Top([]string{"--addr", addr, "--domain", "api", "--once", "--token-file", token}, &out, &errOut); err != nil {
		t.Fatalf("charon top: %v\n%s", err, errOut.String())
	}
	if diff := cmp.Diff([]string{"/top?domain=api Bearer s3cret", "/top?domain=api Bearer s3cret"}, seen); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	for _, want := range []string{"2 replica(s)", "api  api.yaml:3  api/user", "rejected 3.0", "alice     80", "user=alice", "bob       3"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTopAddrs: --addr names each replica once: the same debug port
// twice, however written, is refused naming it, since its counts would be
// merged twice; so are an address without a port and an empty list.
func TestTopAddrs(t *testing.T) {
	for _, tc := range []struct {
		list    string
		want    []string
		wantErr string
	}{
		{"localhost:6070", []string{"localhost:6070"}, ""},
		{" a:1 , b:2,", []string{"a:1", "b:2"}, ""},
		{"[::1]:6070,127.0.0.1:6070", []string{"[::1]:6070", "127.0.0.1:6070"}, ""},
		{"a:1,a:1", nil, "--addr names a:1 twice"},
		{"Host:6070,host:06070", nil, "--addr names host:6070 twice"},
		{"[0:0::1]:1,[::1]:1", nil, "--addr names [::1]:1 twice"},
		{"a", nil, `--addr "a": want HOST:PORT`},
		{"a:http", nil, `"http" is not a port number`},
		{" , ", nil, "--addr is empty"},
	} {
		got, err := topAddrs(tc.list)
		if tc.wantErr != "" {
			if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: %v, want a usage error with %q", tc.list, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.list, err)
		} else if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%q (-want +got):\n%s", tc.list, diff)
		}
	}
	var out, errOut bytes.Buffer
	if code := ExitCode(Top([]string{"--addr", "a:1,a:1", "--once"}, &out, &errOut), &errOut); code != 2 || !strings.Contains(errOut.String(), "a:1 twice") {
		t.Errorf("charon top --addr a:1,a:1: exit %d, %q; want 2 naming a:1", code, errOut.String())
	}
}
