package copylog

import (
	"encoding/json"
	"fmt"
	"time"
)

// wireState is the serialized form of a State: what cannot be derived. The
// per-domain, per-group and total counts and the session index are rebuilt
// from the holds and transfers.
type wireState struct {
	Holds     []snapHold            `json:"h,omitempty"`
	Transfers []snapTransfer        `json:"t,omitempty"`
	Records   map[string]snapRecord `json:"r,omitempty"`
	Token     int64                 `json:"k,omitempty"`
}

type snapHold struct {
	ID        string   `json:"i"`
	Domain    string   `json:"d"`
	Session   string   `json:"s,omitempty"`
	RequestID string   `json:"q,omitempty"`
	Copies    int64    `json:"c"`
	Groups    []string `json:"g,omitempty"`
	Token     int64    `json:"k"`
	Expires   int64    `json:"e"`
}

type snapTransfer struct {
	ID      string   `json:"i"`
	Domain  string   `json:"d"`
	Copies  int64    `json:"c"`
	Groups  []string `json:"g,omitempty"`
	Expires int64    `json:"e"`
}

type snapRecord struct {
	HoldID  string   `json:"h"`
	Domain  string   `json:"d"`
	Granted int64    `json:"n"`
	Token   int64    `json:"k"`
	Groups  []string `json:"g,omitempty"`
	Expires int64    `json:"e"`
}

// MarshalBinary encodes s for a store that keeps copy logs outside the
// process (times in µs, so the encoding is exact). UnmarshalBinary restores a
// State that answers every operation exactly as s would.
func (s *State) MarshalBinary() ([]byte, error) {
	var snap wireState
	snap.Token = s.token
	for _, h := range s.holds {
		snap.Holds = append(snap.Holds, snapHold{h.id, h.domain, h.session, h.requestID, h.copies, h.groups, h.token, h.expires})
	}
	for _, x := range s.transfers {
		snap.Transfers = append(snap.Transfers, snapTransfer{x.id, x.domain, x.copies, x.groups, x.expires})
	}
	if len(s.records) > 0 {
		snap.Records = make(map[string]snapRecord, len(s.records))
		for id, r := range s.records {
			snap.Records[id] = snapRecord{r.holdID, r.domain, r.granted, r.token, r.groups, r.expires}
		}
	}
	return json.Marshal(&snap)
}

// UnmarshalBinary replaces s with the State data encodes (see MarshalBinary).
func (s *State) UnmarshalBinary(data []byte) error {
	var snap wireState
	if err := json.Unmarshal(data, &snap); err != nil {
		return fmt.Errorf("copylog: decode state: %w", err)
	}
	*s = State{}
	s.init()
	s.token = snap.Token
	for _, h := range snap.Holds {
		if h.ID == "" || h.Copies < 0 {
			return fmt.Errorf("copylog: decode state: bad hold %q", h.ID)
		}
		s.putHold(&hold{id: h.ID, domain: h.Domain, session: h.Session, requestID: h.RequestID,
			copies: h.Copies, groups: h.Groups, token: h.Token, expires: h.Expires})
		s.add(h.Domain, h.Groups, h.Copies)
	}
	for _, x := range snap.Transfers {
		if x.ID == "" || x.Copies < 0 {
			return fmt.Errorf("copylog: decode state: bad transfer %q", x.ID)
		}
		s.transfers[x.ID] = &transfer{id: x.ID, domain: x.Domain, copies: x.Copies, groups: x.Groups, expires: x.Expires}
		s.add(x.Domain, x.Groups, x.Copies)
		s.lower(x.Expires)
	}
	for id, r := range snap.Records {
		s.records[id] = &record{holdID: r.HoldID, domain: r.Domain, granted: r.Granted, token: r.Token, groups: r.Groups, expires: r.Expires}
		s.lower(r.Expires)
	}
	return nil
}

// LastExpiry returns the latest lease, transfer ttl or reservation record
// expiry in s, or the zero Time when s holds none: a store may forget
// everything but the fencing token after it.
func (s *State) LastExpiry() time.Time {
	last, found := int64(0), false
	see := func(e int64) {
		if !found || e > last {
			last, found = e, true
		}
	}
	for _, h := range s.holds {
		see(h.expires)
	}
	for _, x := range s.transfers {
		see(x.expires)
	}
	for _, r := range s.records {
		see(r.expires)
	}
	if !found {
		return time.Time{}
	}
	return time.UnixMicro(last)
}
