// Package pgserver runs a throwaway PostgreSQL server from the local server
// binaries (initdb and postgres): for `pgfence demo`, for the benchmarks, and
// under the test harness internal/pgtest. It imports no test code, so the
// pgfence binary can use it.
//
// # Access
//
// A [Cluster] lives in a temporary directory of its own, mode 0700, owned
// by the user the server runs as (this process's user; the postgres user
// when this process is root, since initdb and postgres refuse to run as
// root). The server's unix socket is in that directory, and only there is
// authentication "trust": no other local user can reach it. By default the
// server does not listen on TCP at all (listen_addresses is empty). With
// [Options].TCP it also listens on 127.0.0.1, where every connection,
// replication included, must log in with the postgres role's password
// (scram-sha-256); [Cluster.URL] carries it.
//
// # Lifetime
//
// The server dies with the process that started it, even when that is
// killed: it is started with a parent-death signal (SIGQUIT, PostgreSQL's
// immediate shutdown). [StartCluster] removes the directories that earlier
// processes left behind, but only directories it can prove are its own
// (owned by the server's user, mode 0700, holding a marker file this
// package wrote as this process's user) whose creator has exited and whose
// server is gone. It never signals a process it did not start: a leftover
// directory whose postmaster.pid names a live process is left alone.
//
// # Controls
//
// Fault tests need to stop, crash and restart a server on the same data
// directory and port: [Cluster.Stop], [Cluster.Crash], [Cluster.Start] and
// [Cluster.Pid]. [Cluster.NewStandby] clones a cluster into a streaming
// standby, and [Cluster.Promote] promotes one.
package pgserver
