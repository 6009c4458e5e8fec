// Package schedule runs a job at most once per slot across every replica
// that shares the database, and never skips a slot in silence: a durable
// record per (job, slot), written under the job's lease, says who ran it,
// with which token, and how it ended.
//
// # Slots
//
// A slot is any key (a date, a batch id), or the time bucket of an
// interval on the database clock ([Runner.Current], [Runner.Every]):
// replicas whose clocks differ agree on the slot because none of their
// clocks is read. [Runner.Run] takes the job's lease
// ([LeasePrefix]+job, with [Config].MaxHold), starts the slot unless it is
// done, calls fn, and records the slot done or failed. A slot left running
// by a holder that died or lost its lease is run again by the next
// [Runner.Run] of it (the retry is observed as [pgfence.SlotRetried]); a
// failed slot too; a done slot never ([ErrSlotDone], [pgfence.SlotSkipped]).
//
// # The record is fenced
//
// pgfence_slot_begin and pgfence_slot_finish accept only the job's lease
// held with its token and secret on the database clock, and lock the lease
// row until their transaction ends, so a holder paused past its TTL cannot
// start a slot, nor mark one done, once another holder took over.
// [Runner.RunTx] records done in fn's own transaction: the slot is done
// exactly when fn's writes commit. What fn does outside the database is
// done at least once: a holder that dies after its side effect and before
// the record leaves the slot running, and it runs again.
//
// # Observing
//
// [Config].Observer receives [pgfence.SlotDone], [pgfence.SlotFailed],
// [pgfence.SlotSkipped] and [pgfence.SlotRetried]; [Config].Logger warns of
// retries and failures; [Runner.Stats] counts them; [Runner.History] and
// pgfence ls --jobs read the records.
//
// # What is not guaranteed
//
// A caller that names slots from its own clock gets one run per name, not
// one per interval of real time; derive time slots from the database clock.
// Deleting records ([Runner.Prune]) lets a slot asked for again run again.
// See docs/schedule.md.
package schedule
