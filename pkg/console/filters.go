package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// deadFilter reads the dead-letter filter from a form or query.
func deadFilter(form url.Values) (queue.DeadFilter, error) {
	f := queue.DeadFilter{ClientID: strings.TrimSpace(form.Get("client"))}
	var err0, err1, err2 error
	if reason := strings.TrimSpace(form.Get("reason")); reason != "" {
		if f.Reason, err0 = request.ParseReason(reason); err0 != nil {
			err0 = errStatus{http.StatusBadRequest, err0}
		}
	}
	f.Since, err1 = timeField("since", form.Get("since"))
	f.Until, err2 = timeField("until", form.Get("until"))
	return f, errors.Join(err0, err1, err2)
}

// timeField reads a time an operator typed: RFC 3339, or a browser's datetime-local
// (taken as UTC); empty is none.
func timeField(name, s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := request.ParseTime(s); err == nil {
		return t, nil
	}
	for _, layout := range []string{"2006-01-02T15:04:05", "2006-01-02T15:04"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errStatus{http.StatusBadRequest, fmt.Errorf("%s %q: a time such as 2026-12-03T08:00 (UTC) or RFC 3339", name, s)}
}
