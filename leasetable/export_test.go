package leasetable

// SetNoRetry turns off the retries of transient database errors, for the
// negative controls of the failover tests. Call it before using k.
func SetNoRetry(k *Locker) { k.noRetry = true }

// SetKeepStale keeps the connections on which a statement failed because
// the server is read-only, for a negative control. Call it before using k.
func SetKeepStale(k *Locker) { k.keepStale = true }

// SetNoShareAttempts makes every waiting Acquire of k send its own attempt
// rather than wait for one in flight, for the negative control of the
// herd test. Call it before using k.
func SetNoShareAttempts(k *Locker) { k.noShare = true }
