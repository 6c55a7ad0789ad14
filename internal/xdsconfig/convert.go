package xdsconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"

	"github.com/charonlimit/charon/config"
)

// Fields of envoyproxy/ratelimit's RateLimitDescriptor that are newer than
// the generated type: read from a descriptor's unknown fields.
const (
	fieldQuotaMode = 7 // bool quota_mode
	fieldMetadata  = 8 // google.protobuf.Struct metadata
)

// Resources are the RateLimitConfigs of one DiscoveryResponse, decoded.
type Resources struct {
	// Files holds one YAML file per resource in envoyproxy/ratelimit's
	// format, named by FileName; Load reads it like a directory.
	Files fs.FS
	// Configs are the resources, in the response's order; Names their
	// file names.
	Configs []*rlsconfv3.RateLimitConfig
	Names   []string
}

// Decode unpacks the resources of a response and writes each as a YAML
// file. It fails on a resource that is not a RateLimitConfig, does not
// unmarshal, has a field it does not know or repeats another's name; the
// contents are left to the loader to judge.
func Decode(resources []*anypb.Any) (*Resources, error) {
	r := &Resources{}
	files := config.Files{}
	var errs []error
	for i, a := range resources {
		c := &rlsconfv3.RateLimitConfig{}
		if a.GetTypeUrl() != TypeURL {
			errs = append(errs, fmt.Errorf("resources[%d]: type %s, want %s", i, a.GetTypeUrl(), TypeURL))
			continue
		}
		if err := (proto.UnmarshalOptions{}).Unmarshal(a.GetValue(), c); err != nil {
			errs = append(errs, fmt.Errorf("resources[%d]: %v", i, err))
			continue
		}
		name := FileName(c.GetName(), i)
		if j := slices.Index(r.Names, name); j >= 0 {
			errs = append(errs, fmt.Errorf("resource %q: resources[%d] and [%d] have the same name", c.GetName(), j, i))
			continue
		}
		doc, err := toYAML(c)
		if err != nil {
			errs = append(errs, fmt.Errorf("resource %q (domain %q): %v", c.GetName(), c.GetDomain(), err))
			continue
		}
		r.Configs, r.Names = append(r.Configs, c), append(r.Names, name)
		files[name] = doc
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	r.Files = files
	return r, nil
}

// FileName is the file name of resource i named name: the name, with "%",
// "/" and a leading "." written %XX (so that it is one visible file), or
// "resources[i]" when it has none.
func FileName(name string, i int) string {
	if name == "" {
		return "resources[" + strconv.Itoa(i) + "]"
	}
	name = strings.ReplaceAll(name, "%", "%25")
	name = strings.ReplaceAll(name, "/", "%2F")
	if strings.HasPrefix(name, ".") {
		name = "%2E" + name[1:]
	}
	return name
}

// Explain rewrites an error of config.Load of r.Files so that each problem
// names the resource and its domain, and each descriptor in its path the
// key and value it has ("resource "edge" (domain "edge_proxy"):
// descriptors[0]{remote_address}.rate_limit.unit: ..."), without the line
// numbers of the YAML that Decode wrote. One problem a line.
func (r *Resources) Explain(err error) string {
	var lines []string
	for _, p := range config.Problems(err) {
		var ce *config.Error
		i := -1
		if errors.As(p, &ce) {
			i = slices.Index(r.Names, ce.File)
		}
		if i < 0 {
			lines = append(lines, p.Error())
			continue
		}
		c := r.Configs[i]
		s := fmt.Sprintf("resource %q (domain %q): ", c.GetName(), c.GetDomain())
		if ce.Path != "" {
			s += describePath(c, ce.Path) + ": "
		}
		lines = append(lines, s+ce.Message)
	}
	return strings.Join(lines, "\n")
}

// describePath adds to each descriptors[N] of path the key (and value)
// of that descriptor of c.
func describePath(c *rlsconfv3.RateLimitConfig, path string) string {
	level := c.GetDescriptors()
	var b strings.Builder
	for path != "" {
		seg, rest, _ := strings.Cut(path, ".")
		path = rest
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(seg)
		idx, ok := strings.CutPrefix(seg, "descriptors[")
		if !ok {
			level = nil
			continue
		}
		n, err := strconv.Atoi(strings.TrimSuffix(idx, "]"))
		if err != nil || n < 0 || n >= len(level) {
			level = nil
			continue
		}
		d := level[n]
		b.WriteString("{" + d.GetKey())
		if d.GetValue() != "" {
			b.WriteString("=" + d.GetValue())
		}
		b.WriteString("}")
		level = d.GetDescriptors()
	}
	return b.String()
}

// yamlDoc, yamlDescriptor and yamlLimit are envoyproxy/ratelimit's YAML
// format, as its own conversion of RateLimitConfig writes it.
type yamlDoc struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors,omitempty"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value,omitempty"`
	RateLimit      *yamlLimit       `yaml:"rate_limit,omitempty"`
	ShadowMode     bool             `yaml:"shadow_mode,omitempty"`
	DetailedMetric bool             `yaml:"detailed_metric,omitempty"`
	QuotaMode      bool             `yaml:"quota_mode,omitempty"`
	Metadata       map[string]any   `yaml:"metadata,omitempty"`
	Descriptors    []yamlDescriptor `yaml:"descriptors,omitempty"`
}

type yamlLimit struct {
	// Unit is absent for UNKNOWN (0), the proto's "no unit" of an
	// unlimited limit.
	Unit            string        `yaml:"unit,omitempty"`
	RequestsPerUnit *uint32       `yaml:"requests_per_unit,omitempty"`
	Unlimited       bool          `yaml:"unlimited,omitempty"`
	Name            string        `yaml:"name,omitempty"`
	Replaces        []yamlReplace `yaml:"replaces,omitempty"`
}

type yamlReplace struct {
	Name string `yaml:"name"`
}

// toYAML writes c in envoyproxy/ratelimit's YAML format.
func toYAML(c *rlsconfv3.RateLimitConfig) ([]byte, error) {
	if err := allKnown(c); err != nil {
		return nil, err
	}
	ds, err := descriptorsYAML(c.GetDescriptors(), "descriptors")
	if err != nil {
		return nil, err
	}
	return yaml.Marshal(yamlDoc{Domain: c.GetDomain(), Descriptors: ds})
}

func descriptorsYAML(ds []*rlsconfv3.RateLimitDescriptor, path string) ([]yamlDescriptor, error) {
	out := make([]yamlDescriptor, 0, len(ds))
	for i, d := range ds {
		p := fmt.Sprintf("%s[%d]", path, i)
		y := yamlDescriptor{Key: d.GetKey(), Value: d.GetValue(), ShadowMode: d.GetShadowMode(), DetailedMetric: d.GetDetailedMetric()}
		if err := newerFields(d, &y); err != nil {
			return nil, fmt.Errorf("%s: %v", p, err)
		}
		if l := d.GetRateLimit(); l != nil {
			if err := allKnown(l); err != nil {
				return nil, fmt.Errorf("%s.rate_limit: %v", p, err)
			}
			y.RateLimit = &yamlLimit{Unlimited: l.GetUnlimited(), Name: l.GetName()}
			y.RateLimit.Unit = unitName(l.GetUnit())
			// A limit of 0 requests is a limit (everything refused); an
			// unlimited one has none unless given.
			if n := l.GetRequestsPerUnit(); n > 0 || !l.GetUnlimited() {
				y.RateLimit.RequestsPerUnit = &n
			}
			for j, r := range l.GetReplaces() {
				if err := allKnown(r); err != nil {
					return nil, fmt.Errorf("%s.rate_limit.replaces[%d]: %v", p, j, err)
				}
				y.RateLimit.Replaces = append(y.RateLimit.Replaces, yamlReplace{Name: r.GetName()})
			}
		}
		children, err := descriptorsYAML(d.GetDescriptors(), p+".descriptors")
		if err != nil {
			return nil, err
		}
		if len(children) > 0 {
			y.Descriptors = children
		}
		out = append(out, y)
	}
	return out, nil
}

// envoyproxy/ratelimit's MONTH, YEAR and WEEK, newer than the generated
// enum (Envoy Gateway sends MONTH and YEAR for its budgets).
const (
	unitMonth rlsconfv3.RateLimitUnit = 5
	unitYear  rlsconfv3.RateLimitUnit = 6
	unitWeek  rlsconfv3.RateLimitUnit = 7
)

// unitName is u's name in the YAML, "" for UNKNOWN (the proto's "no unit"
// of an unlimited limit); a number no proto names stays a number, which
// the loader refuses.
func unitName(u rlsconfv3.RateLimitUnit) string {
	switch u {
	case rlsconfv3.RateLimitUnit_UNKNOWN:
		return ""
	case unitMonth:
		return "MONTH"
	case unitYear:
		return "YEAR"
	case unitWeek:
		return "WEEK"
	}
	return u.String()
}

// newerFields reads quota_mode and metadata, which envoyproxy/ratelimit's
// RateLimitDescriptor has and the generated type does not, from d's unknown
// fields; any other unknown field is an error rather than a setting
// silently lost.
func newerFields(d *rlsconfv3.RateLimitDescriptor, y *yamlDescriptor) error {
	b := []byte(d.ProtoReflect().GetUnknown())
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == fieldQuotaMode && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			y.QuotaMode, b = v != 0, b[n:]
		case num == fieldMetadata && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			s := &structpb.Struct{}
			if err := proto.Unmarshal(v, s); err != nil {
				return fmt.Errorf("metadata: %v", err)
			}
			y.Metadata, b = s.AsMap(), b[n:]
			if len(y.Metadata) == 0 {
				y.Metadata = nil
			}
		default:
			return fmt.Errorf("field %d is not known", num)
		}
	}
	return nil
}

// allKnown refuses a message with fields the generated type does not
// know.
func allKnown(m proto.Message) error {
	b := m.ProtoReflect().GetUnknown()
	if len(b) == 0 {
		return nil
	}
	num, _, n := protowire.ConsumeTag(b)
	if n < 0 {
		return protowire.ParseError(n)
	}
	return fmt.Errorf("field %d is not known", num)
}
