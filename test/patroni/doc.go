// Package patroni runs pgfence against a real highly available PostgreSQL:
// etcd plus three Patroni nodes of PostgreSQL 15 on loopback, started by
// the test process in a private temporary directory and stopped by it. The
// suite is behind the build tag "patroni", in the test module:
//
//	cd test && go test -tags patroni -race -count=1 -timeout 12m -v ./patroni/...
//
// (make patroni-ci, at the root, prints its summary lines). It needs the packages
// patroni, etcd-server, etcd-client, python3-etcd and python3-psycopg2
// (.ci/patroni-setup installs them) and, as root, a postgres user to run
// Patroni and PostgreSQL as.
//
// # Cluster
//
// [Start] starts etcd and the nodes with Patroni's ttl 10, loop_wait 1,
// retry_timeout 4 and primary_start_timeout 0, synchronous_mode on or off.
// Clients connect to each node's own port, with the multi-host URL of
// [Cluster.URL] (target_session_attrs=read-write, connect_timeout). The
// nodes replicate from each other through an in-process [pgtest.Proxy] in
// front of each node (its Patroni connect_address), so a test can cut one
// node's replication without touching the clients. The faults: a Patroni
// switchover ([Cluster.Switchover]), a postmaster killed with SIGKILL
// ([Node.KillPostmaster]), a node crash (Patroni and its postmaster killed
// with SIGKILL, [Node.Crash]), and a replication cut (a blackhole on the
// node's proxy).
//
// Only this package's own processes are signalled: its etcd and Patroni
// children, and the postmasters whose command line names one of its own
// data directories (Patroni detaches its postmaster, so that is how it is
// recognised). Patroni is started with a parent-death signal (SIGTERM, on
// which it stops its PostgreSQL), etcd with SIGKILL, so nothing outlives a
// killed test process.
//
// # Workload and checks
//
// A [Workload] runs leasetable and advisory holders, each with its own
// Locker and pool on the multi-host URL, and leases held across a fault
// ([Workload.StartLongHold]). Each holder makes fenced writes (package
// fence) that also insert an audit row in the same transaction; a holder
// that learns it lost its lock leaves a zombie that writes with its old
// token once a newer holder's write was acknowledged. [Check] then reports:
// tokens granted twice, tokens not increasing per name, overlapping holds
// (each holder's belief, from its grant until it learned of a loss or
// released), accepted writes below an acknowledged token, zombie writes
// accepted, acknowledged writes missing from the audit trail, and rows that
// disagree with it. A [Monitor] polls every node to tell when the new
// primary became writable.
package patroni
