package xdsconfig

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestPairs: the node's metadata skips an entry without "=", as
// envoyproxy/ratelimit does ("key1:val1,key2=val2" keeps key2); headers
// refuse one.
func TestPairs(t *testing.T) {
	md := Pairs{Sep: "=", Skip: true}
	if err := md.Set("key1:val1,key2=val2, ,=x"); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"key2": "val2"}, md.M); diff != "" {
		t.Errorf("metadata (-want +got):\n%s", diff)
	}
	h := Pairs{Sep: ":"}
	if err := h.Set("authorization:Bearer x,token"); err == nil {
		t.Error("a header without ':' accepted")
	}
}
