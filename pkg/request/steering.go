package request

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// MaxInterval is the longest interval between two sends to a client that the service
// takes, configured or steered: a week. Longer ones are refused where they are given, and
// the dispatcher holds a longer one found in the control bucket (written by another
// tool) to it: the arithmetic of due times and of the overdue count would overflow near
// 850,000 hours.
const MaxInterval = 7 * 24 * time.Hour

// Steering is what operators set, for one client or for all of them: kept in the control
// bucket, watched by every dispatcher, shown to operators. For all clients only Interval
// counts.
type Steering struct {
	// Interval replaces the configured interval when positive.
	Interval Duration `json:"interval,omitzero"`
	// Paused: the dispatcher sends nothing to the client; its requests wait.
	Paused bool `json:"paused,omitempty"`
	// PurgeThrough: the client's requests up to this stream sequence are dead-lettered
	// unsent (reason "purged") by the dispatcher that owns the client.
	PurgeThrough uint64 `json:"purgeThrough,omitempty"`
	// UpdatedAt and By say when and by whom it was last changed, for operators.
	UpdatedAt time.Time `json:"updatedAt,omitzero"`
	By        string    `json:"by,omitempty"`
}

// IsZero says whether s steers nothing.
func (s Steering) IsZero() bool { return s.Interval == 0 && !s.Paused && s.PurgeThrough == 0 }

// Same says whether s and o steer alike, whoever changed them when.
func (s Steering) Same(o Steering) bool {
	return s.Interval == o.Interval && s.Paused == o.Paused && s.PurgeThrough == o.PurgeThrough
}

// String says what s steers, for people: "interval 8s, paused", or "none".
func (s Steering) String() string {
	var parts []string
	if s.Interval > 0 {
		parts = append(parts, "interval "+time.Duration(s.Interval).String())
	}
	if s.Paused {
		parts = append(parts, "paused")
	}
	if s.PurgeThrough > 0 {
		parts = append(parts, fmt.Sprintf("purging through seq %d", s.PurgeThrough))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// SteerChange is one change of steering: for one client (Client is its subject token,
// EncodeClientID of its id), or for all when Client is empty. Steering removed comes as
// the zero Steering: back to the configured defaults. A change of raven's budget comes
// with Budget set instead (the zero Budget: back to the configured one).
type SteerChange struct {
	Client   string
	Steering Steering
	Budget   *Budget
}

// Duration is a time.Duration that reads and writes as text ("10s") in JSON.
type Duration time.Duration

// MarshalJSON writes d as Go duration text.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads Go duration text.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be text such as \"10s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}
