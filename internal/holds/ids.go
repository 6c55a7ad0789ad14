package holds

import (
	"crypto/rand"
	"encoding/base64"
	"strings"
)

// idRandomBytes is the randomness of every hold, transfer and session id:
// 128 bits, so that an id can be neither guessed nor repeated.
const idRandomBytes = 16

var idEncoding = base64.RawURLEncoding

// NewID mints an opaque hold or transfer id of resource:
// base64url(resource) "." base64url(16 random bytes from crypto/rand), both
// without padding. The resource part lets any server find the copy log from
// the id alone; the random part makes the id unguessable.
func NewID(resource string) (string, error) {
	var r [idRandomBytes]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	n := idEncoding.EncodedLen(len(resource))
	b := make([]byte, n+1+idEncoding.EncodedLen(idRandomBytes))
	idEncoding.Encode(b, []byte(resource))
	b[n] = '.'
	idEncoding.Encode(b[n+1:], r[:])
	return string(b), nil
}

// NewSessionID mints a random session id (base64url of 16 random bytes).
func NewSessionID() (string, error) {
	var r [idRandomBytes]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	return idEncoding.EncodeToString(r[:]), nil
}

// ResourceOf returns the resource an id minted by NewID names; ok is false
// for a string NewID cannot have produced.
func ResourceOf(id string) (resource string, ok bool) {
	enc, rnd, found := strings.Cut(id, ".")
	if !found || enc == "" || len(rnd) != idEncoding.EncodedLen(idRandomBytes) {
		return "", false
	}
	if _, err := idEncoding.DecodeString(rnd); err != nil {
		return "", false
	}
	b, err := idEncoding.DecodeString(enc)
	if err != nil {
		return "", false
	}
	return string(b), true
}
