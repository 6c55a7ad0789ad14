package descriptors

import (
	"slices"
	"strings"
	"testing"
)

func TestTruncate(t *testing.T) {
	long := strings.Repeat("a", MaxQuoted+10)
	for _, tt := range []struct{ in, want string }{
		{"", ""},
		{"short", "short"},
		{long[:MaxQuoted], long[:MaxQuoted]},
		{long, long[:MaxQuoted] + "…"},
		// A rune across the cut is left out whole.
		{long[:MaxQuoted-1] + "é" + long, long[:MaxQuoted-1] + "…"},
	} {
		if got := Truncate(tt.in); got != tt.want {
			t.Errorf("Truncate(%d bytes) = %q, want %q", len(tt.in), got, tt.want)
		}
	}
}

func TestParseDescriptor(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    []Entry
		wantErr string
	}{
		{"k=v", []Entry{{"k", "v"}}, ""},
		{"a=1,b=2", []Entry{{"a", "1"}, {"b", "2"}}, ""},
		// A key alone, an empty value, and "=" inside a value.
		{"k,e=,q=a=b", []Entry{{"k", ""}, {"e", ""}, {"q", "a=b"}}, ""},
		{"", nil, `descriptor entry "" has no key`},
		{"k=v,=x", nil, `descriptor entry "=x" has no key`},
		{"=" + strings.Repeat("x", 2*MaxQuoted), nil, "…\" has no key"},
	} {
		got, err := ParseDescriptor(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseDescriptor(%.20q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseDescriptor(%q): %v", tt.in, err)
			continue
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("ParseDescriptor(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
