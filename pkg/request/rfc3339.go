package request

import "time"

// ParseTime reads an RFC 3339 time as the RFC defines it, which Go's time package does
// not quite: the "T" and "Z" may be lower case (its section 5.6), and a leap second
// (second 60, which comes only at the end of a UTC day: 23:59:60Z, or that moment in
// another offset) is taken as the second after second 59, as a clock that does not count
// leap seconds has it. A value Go reads is read as Go reads it.
func ParseTime(v string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, v)
	if err == nil || len(v) < 20 {
		return t, err
	}
	b := []byte(v)
	if b[10] == 't' {
		b[10] = 'T'
	}
	if b[len(b)-1] == 'z' {
		b[len(b)-1] = 'Z'
	}
	leap := b[16] == ':' && b[17] == '6' && b[18] == '0' && !isDigit(b[19])
	if leap {
		b[17], b[18] = '5', '9'
	}
	if t, err2 := time.Parse(time.RFC3339Nano, string(b)); err2 == nil {
		if leap {
			if t = t.Add(time.Second); t.Sub(t.UTC().Truncate(24*time.Hour)) >= time.Second {
				return time.Time{}, &time.ParseError{Layout: time.RFC3339, Value: v, Message: ": second 60 comes only at the end of a UTC day (23:59:60Z)"}
			}
		}
		return t, nil
	}
	return t, err // Go's own error, about the value as it was sent
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
