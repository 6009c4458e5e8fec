package leasetable

// SetNoRetry turns off the retries of transient database errors, for the
// negative controls of the failover tests. Call it before using k.
func SetNoRetry(k *Locker) { k.noRetry = true }
