package queue

// Dead-letter headers, added to a request when it is moved to the dead-letter stream.
const (
	headerDeadReason       = "Dispatch-Dead-Reason"
	headerDeadLastStatus   = "Dispatch-Dead-Last-Status"
	headerDeadLastError    = "Dispatch-Dead-Last-Error"
	headerDeadAttempts     = "Dispatch-Dead-Attempts"
	headerDeadFirstAttempt = "Dispatch-Dead-First-Attempt"
	headerDeadLastAttempt  = "Dispatch-Dead-Last-Attempt"
	headerDeadAcceptedAt   = "Dispatch-Dead-Accepted-At"
	headerDeadOrigSeq      = "Dispatch-Dead-Orig-Seq"
	headerDeadOrigSubject  = "Dispatch-Dead-Orig-Subject"
)
