package holds

import (
	"strings"
	"testing"

	"github.com/charonlimit/charon/copylog"
)

func TestIDs(t *testing.T) {
	for _, r := range []string{"c/db", "x", strings.Repeat("r/é.", 80)} {
		id, err := NewID(r)
		if err != nil {
			t.Fatal(err)
		}
		if len(id) > copylog.MaxIDLen {
			t.Errorf("id of %d bytes, longer than %d", len(id), copylog.MaxIDLen)
		}
		got, ok := ResourceOf(id)
		if !ok || got != r {
			t.Errorf("ResourceOf(NewID(%q)) = %q, %v", r, got, ok)
		}
		id2, _ := NewID(r)
		if id2 == id {
			t.Errorf("two ids of %q are equal", r)
		}
	}
	for _, bad := range []string{"", ".", "abc", "YQ.", "YQ.short", "!!.AAAAAAAAAAAAAAAAAAAAAA", ".AAAAAAAAAAAAAAAAAAAAAA"} {
		if r, ok := ResourceOf(bad); ok {
			t.Errorf("ResourceOf(%q) = %q, true; want false", bad, r)
		}
	}
	s, err := NewSessionID()
	if err != nil || len(s) != 22 {
		t.Errorf("NewSessionID() = %q, %v", s, err)
	}
}
