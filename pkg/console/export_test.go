package console

import "time"

// SetClock makes c read the time from now. Call it before c serves anything.
func SetClock(c *Console, now func() time.Time) { c.now = now }
