package request

import (
	"fmt"
	"strconv"
	"strings"
)

// Lane names one client's queue within its partition: the requests the dispatcher
// reads in order, one attempt at a time. It is the key the dispatcher keeps its lanes,
// fences and asks by; the queue alone turns it into its own address (Subject) and back
// (LaneOf), so the dispatcher never parses one.
type Lane struct {
	Partition int
	// Token is the client's name in the queue (EncodeClientID of its clientId). A request
	// published to the queue by hand may carry a token that decodes to no clientId: it
	// is still a lane, whose head is dead-lettered unsent.
	Token string
}

// LaneOfClient is clientID's lane in partition p.
func LaneOfClient(p int, clientID string) Lane {
	return Lane{Partition: p, Token: EncodeClientID(clientID)}
}

// Subject is where the queue stores the lane's requests: "dispatch.req.<partition>.<token>".
func (l Lane) Subject() string { return RequestPrefix + strconv.Itoa(l.Partition) + "." + l.Token }

// String is the lane's subject, for logs.
func (l Lane) String() string { return l.Subject() }

// ClientID is the clientId the lane's token names; an error for a token that names none.
func (l Lane) ClientID() (string, error) { return DecodeClientID(l.Token) }

// LaneOf returns the lane of a stored request's subject, "dispatch.req.<partition>.<token>".
// A lane has one spelling: "03" or "+3" is no partition. It reads the subject once and
// allocates nothing (it runs for every request the dispatcher watches and reads).
func LaneOf(subject string) (Lane, error) {
	rest, ok := strings.CutPrefix(subject, RequestPrefix)
	part, token, cut := strings.Cut(rest, ".")
	p, err := strconv.Atoi(part)
	if !ok || !cut || err != nil || p < 0 || strconv.Itoa(p) != part || token == "" || strings.Contains(token, ".") {
		return Lane{}, fmt.Errorf("subject %q is not a request subject of one client", subject)
	}
	return Lane{Partition: p, Token: token}, nil
}
