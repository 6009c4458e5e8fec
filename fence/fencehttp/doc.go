// Package fencehttp carries a lock holder's fencing token over HTTP and
// checks it in the service that receives it, so that a holder whose lock
// passed to another cannot overwrite the newer holder's work through the
// service's API.
//
// # The client
//
// [Transport] (or [SetHeaders] on one request) sends the lease's token in
// the [TokenHeader] header and its name, percent-encoded, in [LeaseHeader]:
//
//	client := &http.Client{Transport: &fencehttp.Transport{Lease: lease}}
//	resp, err := client.Post(url, "application/json", body)
//	if err == nil { err = fencehttp.CheckResponse(resp) } // matches pgfence.ErrFenced on a rejection
//
// # The service
//
// [Middleware.Wrap] wraps the handlers that write. For each request it
// begins a transaction on [Config].DB, presents the token to the fence
// registry ([fence.CheckResource]) for the lease's resource, and hands the
// transaction to the handler through the request's context ([Tx]): the
// handler's writes and the registry check commit together, or not at all.
//
//	mw, err := fencehttp.New(fencehttp.Config{DB: pool})
//	mux.Handle("POST /orders", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//		tx := fencehttp.Tx(r.Context())
//		...
//	})))
//
// The answers it gives itself, never passing the request on:
//
//   - 428 Precondition Required: neither header was sent.
//   - 400 Bad Request: one header missing or repeated, a token that is not
//     a positive decimal int64, a lease name that is empty, longer than 512
//     bytes, badly percent-encoded or not UTF-8, or [Config].Resource
//     refusing the request.
//   - 409 Conflict: a token older than the highest the resource has seen;
//     the body says so, and [CurrentTokenHeader] carries the highest.
//   - 503 Service Unavailable: the transaction could not begin or the check
//     failed for another reason (the cause goes to [Config].OnError).
//   - 500 Internal Server Error: the commit failed (the handler's response
//     is dropped), or [Config].Resource named no valid resource.
//
// # Commit and rollback
//
// The handler's response is held in memory until the transaction ends.
// The transaction commits when the handler returns without panicking and
// its status is below 400 (200 when it wrote none); the response is then
// sent as the handler wrote it. A status of 400 or more rolls back and is
// sent as written. A panic rolls back and panics on. A failed commit sends
// 500 and not the handler's response (409 when the commit itself reported a
// stale token); as with any database client, a connection lost during the
// commit leaves its outcome unknown. The handler must not commit or roll
// back the transaction itself ([Tx]'s Commit and Rollback fail); savepoints
// (Begin) are its own. Because the response is buffered, handlers cannot
// stream, flush or hijack the connection.
//
// # What it guarantees, and what it does not
//
// Writes a wrapped handler makes in [Tx] under an accepted token commit
// before any newer token for the resource is accepted (the registry row
// stays locked until the transaction ends), and none are made under a token
// older than one already accepted. It does not cover writes the handler
// makes elsewhere (files, other services: see docs/fencing-anything.md),
// requests to handlers it does not wrap, or a client that sends a forged
// token: authenticate clients as for any other write. A resource should be
// written under one lease name: tokens of every name come from one sequence,
// so a holder of another name would fence it.
package fencehttp
