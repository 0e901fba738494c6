package ingest

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// The single-request path (POST /v1/requests) is the one every request takes: what is
// here keeps it to the work any HTTP ingest must do, without changing a check or an
// answer.

// buffers are byte slices reused for request bodies and answers: a body is needed only
// until JetStream acknowledged it (nats.go copies it out when it publishes), an answer
// only until it is written.
var buffers = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// maxPooled is the largest buffer kept for reuse; a larger one is left to the collector
// rather than pinned.
const maxPooled = 64 << 10

func getBuffer() *[]byte { return buffers.Get().(*[]byte) }

func putBuffer(b *[]byte) {
	if cap(*b) <= maxPooled {
		*b = (*b)[:0]
		buffers.Put(b)
	}
}

// readInto reads r to its end, appending to dst (as io.ReadAll, but into a buffer that
// is reused).
func readInto(dst []byte, r io.Reader) ([]byte, error) {
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := r.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

// jsonContentType is the Content-Type of a JSON answer, set without allocating a slice
// per answer (net/http only reads it).
var jsonContentType = []string{"application/json"}

// writeAccepted answers 202 with v, byte for byte as writeJSON would (a test holds the
// two equal), without reflection.
func writeAccepted(w http.ResponseWriter, v accepted) {
	bp := getBuffer()
	b := append((*bp)[:0], `{"id":`...)
	b = appendJSONString(b, v.ID)
	b = append(b, `,"clientId":`...)
	b = appendJSONString(b, v.ClientID)
	b = append(b, `,"status":`...)
	b = appendJSONString(b, string(v.Status))
	if v.Duplicate {
		b = append(b, `,"duplicate":true`...)
	}
	if !v.NotBefore.IsZero() {
		b = append(b, `,"notBefore":"`...)
		b = v.NotBefore.AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	b = append(b, "}\n"...)
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write(b)
	*bp = b
	putBuffer(bp)
}

// appendJSONString appends s as a JSON string as writeJSON's encoder writes it: <, >
// and & as they are (no HTML escaping), U+2028 and U+2029 escaped, invalid UTF-8
// replaced.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, `\u202`...)
			b = strconv.AppendInt(b, int64(r&0xF), 16)
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// maxValidDepth is how deep validJSON follows nesting itself; a deeper body is left to
// json.Valid, whose own limit then applies.
const maxValidDepth = 64

// validJSON reports exactly what json.Valid reports (a differential test and fuzz target
// hold it to that), in one tight pass: a request body is checked on every request, and
// encoding/json's scanner, one indirect call per byte, was the ingest's largest share of
// CPU of its own.
func validJSON(b []byte) bool {
	var inObject [maxValidDepth]bool
	depth := 0
	i := 0
value: // at i a value must start
	for {
		i = skipSpace(b, i)
		if i == len(b) {
			return false
		}
		ok := true
		switch c := b[i]; {
		case c == '{' || c == '[':
			if depth == maxValidDepth {
				return json.Valid(b)
			}
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == c+2 { // '}' and ']' are two after '{' and '['
				i++
				break
			}
			inObject[depth] = c == '{'
			depth++
			if c == '{' {
				if i = scanKey(b, i); i < 0 {
					return false
				}
			}
			continue value
		case c == '"':
			i, ok = scanString(b, i)
		case c == '-' || c >= '0' && c <= '9':
			i, ok = scanNumber(b, i)
		case c == 't':
			i, ok = scanLiteral(b, i, "true")
		case c == 'f':
			i, ok = scanLiteral(b, i, "false")
		case c == 'n':
			i, ok = scanLiteral(b, i, "null")
		default:
			return false
		}
		if !ok {
			return false
		}
		// After a value: a separator, or the end of containers, or the end of the body.
		for {
			i = skipSpace(b, i)
			if depth == 0 {
				return i == len(b)
			}
			if i == len(b) {
				return false
			}
			switch {
			case b[i] == ',':
				if inObject[depth-1] {
					if i = scanKey(b, skipSpace(b, i+1)); i < 0 {
						return false
					}
				} else {
					i++
				}
				continue value
			case inObject[depth-1] && b[i] == '}', !inObject[depth-1] && b[i] == ']':
				depth--
				i++
			default:
				return false
			}
		}
	}
}

// scanKey checks an object's key and its colon at b[i:]; it returns the index after the
// colon, or -1.
func scanKey(b []byte, i int) int {
	if i == len(b) || b[i] != '"' {
		return -1
	}
	i, ok := scanString(b, i)
	if i = skipSpace(b, i); !ok || i == len(b) || b[i] != ':' {
		return -1
	}
	return i + 1
}

// plain marks the bytes a JSON string holds as they are: not a quote, a backslash or a
// control character. Strings are most of a body, and a table lookup per byte is what
// keeps their scan fast.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// scanString checks the JSON string at b[i] (a quote) and returns the index after it.
func scanString(b []byte, i int) (int, bool) {
	for j := i + 1; j < len(b); {
		for j < len(b) && plain[b[j]] {
			j++
		}
		if j == len(b) {
			break
		}
		switch c := b[j]; {
		case c == '"':
			return j + 1, true
		case c == '\\':
			if j+1 == len(b) {
				return 0, false
			}
			switch b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				if j+6 > len(b) || !isHex(b[j+2]) || !isHex(b[j+3]) || !isHex(b[j+4]) || !isHex(b[j+5]) {
					return 0, false
				}
				j += 6
			default:
				return 0, false
			}
		case c < 0x20:
			return 0, false
		default:
			j++
		}
	}
	return 0, false
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// scanNumber checks the JSON number at b[i] and returns the index after it.
func scanNumber(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i == len(b):
		return 0, false
	case b[i] == '0':
		i++
	case isDigit(b[i]):
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	default:
		return 0, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i == len(b) || !isDigit(b[i]) {
			return 0, false
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i == len(b) || !isDigit(b[i]) {
			return 0, false
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	return i, true
}

func scanLiteral(b []byte, i int, lit string) (int, bool) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return 0, false
	}
	return i + len(lit), true
}
