package request

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strings"
	"time"
)

// MaxIdempotencyKeyBytes is the longest Idempotency-Key accepted, in bytes.
const MaxIdempotencyKeyBytes = 256

// ErrIdempotencyKeyInvalid is returned for an Idempotency-Key that is too long or holds
// anything but printable ASCII.
var ErrIdempotencyKeyInvalid = fmt.Errorf("Idempotency-Key must be 1 to %d printable ASCII characters, not starting or ending with a space", MaxIdempotencyKeyBytes)

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// NewID returns a fresh request id: 26 characters, sortable by creation time to the
// millisecond (48 bits of Unix milliseconds, then 80 random bits).
func NewID(now time.Time) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixMilli())<<16)
	if _, err := rand.Read(b[6:]); err != nil {
		panic(fmt.Sprintf("reading random bytes: %v", err)) // crypto/rand does not fail on supported platforms
	}
	return idEncoding.EncodeToString(b[:])
}

// IDFromKey returns the request id for a caller-chosen Idempotency-Key. It is derived from
// the tenant, the clientId and the key together, so the same key sent again gives the same
// id (and the queue drops the copy), while two clients that happen to pick the same key
// do not collide, nor do two tenants: a key is scoped to the tenant of the token that sent
// it. The tenant is "" for a token without one (and without tokens).
func IDFromKey(tenant, clientID, key string) string {
	h := sha256.New()
	for _, s := range []string{tenant, clientID} {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(s))) // length-prefixed: no two inputs hash the same
		h.Write(n[:])
		h.Write([]byte(s))
	}
	h.Write([]byte(key))
	return "k" + idEncoding.EncodeToString(h.Sum(nil)[:16])
}

// BodyDigestOf identifies the body of a request whose id came from an Idempotency-Key
// (IDFromKey); "" for any other id, which is new each time and has no copies to compare.
func BodyDigestOf(id string, body []byte) string {
	if !strings.HasPrefix(id, "k") {
		return ""
	}
	sum := sha256.Sum256(body)
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}

// ValidateIdempotencyKey checks a caller's Idempotency-Key. A space at either end is
// refused: HTTP drops it from the header, so the same key given as a batch item's field
// would otherwise name another request than the header does.
func ValidateIdempotencyKey(key string) error {
	if key == "" || len(key) > MaxIdempotencyKeyBytes || key[0] == ' ' || key[len(key)-1] == ' ' {
		return ErrIdempotencyKeyInvalid
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return ErrIdempotencyKeyInvalid
		}
	}
	return nil
}
