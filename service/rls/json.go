package rls

import (
	"cmp"
	"errors"
	"io"
	"net/http"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/charonlimit/charon/descriptors"
)

// maxJSONBody bounds a /json request body.
const maxJSONBody = 1 << 20

// serveJSON is envoyproxy/ratelimit's /json endpoint: the RateLimitRequest as
// protojson in, the RateLimitResponse as protojson out, 429 when the overall
// code is OVER_LIMIT. Bad JSON and invalid requests get 400, other failures
// 500, another method than POST 405 with an example.
func (s *Service) serveJSON(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		// A browser's or a bare curl's GET: say how to ask instead.
		w.Header().Set("Allow", http.MethodPost)
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		http.Error(w, "POST a RateLimitRequest as JSON, e.g.\n  curl -s -XPOST "+scheme+"://"+descriptors.Truncate(cmp.Or(r.Host, "HOST:PORT"))+
			`/json -d '{"domain":"D","descriptors":[{"entries":[{"key":"K","value":"V"}]}]}'`+"\n(429 when OVER_LIMIT)", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
		return
	}
	var req rlsv3.RateLimitRequest
	if !utf8.Valid(body) {
		// Header bytes as Envoy forwards them: limited like any other
		// value, never an error (see wire.go). JSON text must be UTF-8, so
		// each stray byte is read as the character of that code (Latin-1).
		body = latin1Invalid(body)
	}
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, "invalid RateLimitRequest JSON: "+descriptors.Truncate(err.Error()), http.StatusBadRequest)
		return
	}
	resp, err := s.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		code := http.StatusInternalServerError
		if status.Code(err) == codes.InvalidArgument {
			code = http.StatusBadRequest
		}
		http.Error(w, status.Convert(err).Message(), code)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, "encoding response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}

// latin1Invalid returns b with every byte that is not part of valid UTF-8
// replaced by the UTF-8 encoding of the character of that code.
func latin1Invalid(b []byte) []byte {
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			out = utf8.AppendRune(out, rune(b[0]))
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return out
}
