package config

import (
	"fmt"
	"math"
	"strings"
	"testing"

	yamlv2 "go.yaml.in/yaml/v2"
	"gopkg.in/yaml.v3"
)

// yaml11Seeds are scalars whose meaning differs between YAML 1.1 (yaml.v2,
// which envoyproxy/ratelimit reads its files with) and YAML 1.2, or that sit
// at the edge of a resolution rule.
var yaml11Seeds = []string{
	"yes", "No", "ON", "off", "y", "N", "true", "False", "~", "null", "", "Null",
	"0", "-0", "+12", "012", "0o17", "0x1F", "0b101", "1_000", "9223372036854775807", "9223372036854775808",
	"18446744073709551615", "18446744073709551616", "-9223372036854775809", "1e3", "1.5", ".5", "5.", "-.inf",
	".NaN", "+.Inf", "1:30", "190:20:30", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "2002-12-14 21:59:43",
	"!!str 12", "!!int 12", "!!bool yes", "!!bool 1", "!!float 1", "!!null ''", "'yes'", `"on"`, "0.1e-2", "1e", "_1",
	"+", "-", ".", "0x", "1__2", "1.2.3", "12e03", "-0x1A",
}

// FuzzYAML11MatchesYAMLv2: the value the loader gives a scalar is the value
// yaml.v2 decodes it to into an interface{}, and a scalar yaml.v2 refuses is
// refused (a file means the same to Charon as to envoyproxy/ratelimit).
func FuzzYAML11MatchesYAMLv2(f *testing.F) {
	for _, s := range yaml11Seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if strings.ContainsAny(s, "\n\r") {
			return // one line: the value of one key
		}
		if t := strings.TrimLeft(s, " \t"); t == "!" || strings.HasPrefix(t, "! ") || strings.HasPrefix(t, "!\t") {
			// The non-specific tag: yaml.v3 resolves `! 12` to an int and
			// keeps no trace of the tag, where yaml.v2 reads a string. A
			// known difference, in no configuration one would write.
			return
		}
		doc := "k: " + s + "\n"
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(doc), &n); err != nil || len(n.Content) != 1 || len(n.Content[0].Content) != 2 {
			return
		}
		v := n.Content[0].Content[1]
		if v.Kind != yaml.ScalarNode {
			return
		}
		var m map[string]any
		errV2 := yamlv2.Unmarshal([]byte(doc), &m)
		got, ok := yaml11(v)
		if errV2 != nil {
			if ok {
				t.Errorf("%q: yaml.v2 refuses it (%v), the loader reads %#v", s, errV2, got)
			}
			return
		}
		want, inMap := m["k"]
		if !inMap {
			return
		}
		if !ok {
			t.Fatalf("%q: the loader refuses it, yaml.v2 reads %#v", s, want)
		}
		if !same11(got, want) {
			t.Errorf("%q: the loader reads %#v (%T), yaml.v2 %#v (%T)", s, got, got, want, want)
		}
	})
}

// same11 compares a loader value with yaml.v2's: yaml.v2 gives an int where
// it fits, the loader an int64; NaN equals NaN.
func same11(got, want any) bool {
	if w, ok := want.(int); ok {
		want = int64(w)
	}
	if g, ok := got.(float64); ok {
		if w, ok := want.(float64); ok && math.IsNaN(g) && math.IsNaN(w) {
			return true
		}
	}
	return fmt.Sprintf("%T %v", got, got) == fmt.Sprintf("%T %v", want, want)
}
