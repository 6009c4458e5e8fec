package advisory

import "time"

// SetFirstPollInterval sets the first pause of l's waiting Lock calls (5ms
// otherwise), so that tests can make polling too slow to matter. Call it
// before l is used.
func SetFirstPollInterval(l *Locker, d time.Duration) { l.minPoll = d }
