package pgtest

import (
	"context"

	"github.com/pgfence/pgfence/internal/pgserver"
)

// Cluster is a throwaway PostgreSQL server from the local server binaries,
// with the controls fault tests need (stop, crash, restart, pid); see
// [pgserver.Cluster]. The harness's clusters listen on 127.0.0.1 as well
// as on their private socket, for the tests' fault proxies; TCP requires
// the postgres role's password, which [Cluster.URL] carries.
type Cluster = pgserver.Cluster

// ClusterOptions configures a throwaway cluster; see [pgserver.Options].
// The harness always sets TCP.
type ClusterOptions = pgserver.Options

// FindBinDir returns a directory holding initdb and postgres, or "" when
// none is found; see [pgserver.FindBinDir].
func FindBinDir() string { return pgserver.FindBinDir() }

// StartCluster initialises and starts a new cluster that listens on
// 127.0.0.1 (password required) and on its private socket. Call Destroy
// when done.
func StartCluster(ctx context.Context, binDir string, opts *ClusterOptions) (*Cluster, error) {
	var o ClusterOptions
	if opts != nil {
		o = *opts
	}
	o.TCP = true
	return pgserver.StartCluster(ctx, binDir, &o)
}
