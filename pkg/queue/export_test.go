package queue

import "context"

// RequeuePublishOnly is Requeue stopped between its two steps, as by a crash.
func (q *Queue) RequeuePublishOnly(r DeadRecord) (bool, error) {
	return q.requeuePublish(context.Background(), r)
}

// ProbeWrite is one test write, as WatchWrites makes them.
func (q *Queue) ProbeWrite() error { return q.probeWrite(context.Background()) }
