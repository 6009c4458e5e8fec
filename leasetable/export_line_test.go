package leasetable

// SetNoDBLine keeps k's waiting permit calls out of the database's line
// (line.go), for the negative controls of the fairness tests. Call it
// before using k.
func SetNoDBLine(k *Locker) { hooksOf(k).noDBLine = true }

// SetNoDBLinePing stops k's line holders from pinging their connections, as
// a paused process would. Call it before using k.
func SetNoDBLinePing(k *Locker) { hooksOf(k).noDBLinePing = true }

// SetLateWatch has k watch a waiter's name for notifications only once the
// waiter first waits for them, as before the fix that TestArmedWaiterWoken
// covers, for its negative control. Call it before using k.
func SetLateWatch(k *Locker) { hooksOf(k).lateWatch = true }

// SetOnNotify has f called after k acted on (or dropped) each notification
// its LISTEN connection received. Call it before using k.
func SetOnNotify(k *Locker, f func()) { hooksOf(k).onNotify = f }

// LineKeySQL is the SQL of semaphore $1's line key, for tests that look
// for it in pg_locks.
const LineKeySQL = lineKeySQL

// SetNoClaim keeps k's heads of semaphores' lines from registering claims,
// so that a release notifies them instead of granting them the permit, for
// the hand-over tests' negative controls. Call it before using k.
func SetNoClaim(k *Locker) { hooksOf(k).noClaim = true }

// SetOnHanded has f called with the token of each permit k adopted from a
// grant's notification (a release handed it to k's claim). Call it before
// using k.
func SetOnHanded(k *Locker, f func(token int64)) { hooksOf(k).onHanded = f }
