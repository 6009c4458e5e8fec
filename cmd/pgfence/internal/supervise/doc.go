// Package supervise runs a command the way `pgfence run` needs: in its own
// process group, with signals forwarded to that group, and with a way to
// end the whole group (SIGTERM, then SIGKILL after a grace period) when the
// lock protecting the command is lost.
//
// # Process group
//
// The command is started as the leader of a new process group, so that
// everything it starts (a shell's pipeline, a worker pool) can be signalled
// at once. A consequence: the command is not in the terminal's foreground
// process group, so it does not receive the terminal's SIGINT itself (it is
// forwarded, see below), and a command that reads from the terminal is
// stopped by SIGTTIN. Commands under a lock are meant to be batch jobs;
// redirect their standard input when running them from a terminal.
//
// # Signals
//
// [Run] forwards every signal received on [RunOpts.Signals] to the whole
// process group, and goes on waiting: the command decides whether the
// signal ends it, and its exit status is reported as usual.
//
// # Loss
//
// When [RunOpts.Lost] is closed, [Run] sends SIGTERM to the process group,
// waits up to [RunOpts.Grace] for the group to empty, then sends SIGKILL to
// whatever is left. The same happens to processes the command left behind
// in its group when it exits on its own, so nothing keeps running once Run
// has returned and the lock is released.
//
// # When this process dies
//
// On Linux the command gets SIGKILL from the kernel when the process that
// started it dies (its parent-death signal). Without a supervisor only the
// command itself gets it: processes it started keep running until they
// notice. Elsewhere the command outlives its supervisor.
//
// # Supervisor
//
// With [RunOpts].Supervisor set, [Run] starts a supervisor process (this
// program re-executed, calling [Serve]) that starts the command and talks
// to Run over two pipes. The supervisor is a child subreaper, so every
// descendant of the command stays its descendant, whatever process group
// or session it moves to. Loss and leftovers end every descendant (SIGTERM,
// SIGKILL after the grace period), not only the group. When Run's process
// dies, even by SIGKILL, the control pipe reaches end of file and the
// supervisor kills every descendant with SIGKILL at once, then exits. Not
// covered: processes started on the command's behalf by another service,
// outside the tree, and the supervisor itself killed by SIGKILL.
//
// # Exit status
//
// [Exit.Status] follows the shell's convention: the command's exit code, or
// 128 plus the signal number when a signal ended it.
package supervise
