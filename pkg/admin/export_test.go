package admin

// SetOldestRead lowers how many requests the oldest-first page reads in the queue's
// order, so that a test takes the way that reads every head.
func (s *Service) SetOldestRead(n int) { s.oldestRead = n }
