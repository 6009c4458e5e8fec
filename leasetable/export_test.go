package leasetable

// SetNoRetry turns off the retries of transient database errors, for the
// negative controls of the failover tests. Call it before using k.
func SetNoRetry(k *Locker) { k.noRetry = true }

// SetKeepStale keeps the connections on which a statement failed because
// the server is read-only, for a negative control. Call it before using k.
func SetKeepStale(k *Locker) { k.keepStale = true }
