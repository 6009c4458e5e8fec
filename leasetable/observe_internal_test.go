package leasetable

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
)

type reqKey struct{}

func reqOf(ctx context.Context) string {
	id, _ := ctx.Value(reqKey{}).(string)
	return id
}

// batchOps records the acquire operations that cover several callers.
type batchOps struct {
	mu    sync.Mutex
	req   string   // the batch operation's ctx's request id
	links []string // its Links' request ids
	batch int
}

func (o *batchOps) Observe(context.Context, pgfence.Event) {}

func (o *batchOps) StartOp(ctx context.Context, op pgfence.Op) context.Context {
	if op.Kind == pgfence.OpAcquire && op.Batch > 1 {
		o.mu.Lock()
		o.req, o.batch = reqOf(ctx), op.Batch
		for _, l := range op.Links {
			o.links = append(o.links, reqOf(l))
		}
		o.mu.Unlock()
	}
	return ctx
}

func (o *batchOps) EndOp(context.Context, pgfence.Op, error) {}

// reqGate is a gate that also records the request id of each acquire
// statement.
type reqGate struct {
	gate
	mu   sync.Mutex
	reqs []string
}

func (g *reqGate) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pgfence_acquire(") {
		g.mu.Lock()
		g.reqs = append(g.reqs, reqOf(ctx))
		g.mu.Unlock()
	}
	return g.gate.TraceQueryStart(ctx, c, d)
}

// TestAcquireBatchOperation: an acquire statement serving several callers
// runs with the values of the request that opened the batch, as an
// operation of its own whose Links are the other callers' ctxs.
func TestAcquireBatchOperation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	g := &reqGate{gate: gate{started: make(chan []string, 10), open: make(chan struct{})}}
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = g })
	ops := &batchOps{}
	k, err := New(ctx, pool, &Config{Observer: ops})
	require.NoError(t, err)
	t.Cleanup(k.Close)

	errs := make(chan error, 10)
	try := func(req, name string) {
		l, err := k.TryAcquire(context.WithValue(ctx, reqKey{}, req), name, nil)
		if err == nil {
			err = l.Release(ctx)
		}
		errs <- err
	}
	go try("slot", "slot")
	<-g.started
	want := map[string]bool{}
	for i := range 3 {
		req := fmt.Sprintf("req-%d", i)
		want[req] = true
		go try(req, fmt.Sprintf("name-%d", i))
	}
	waitQueued(t, k, 3)
	close(g.open)
	require.Len(t, <-g.started, 3, "one statement for the three")
	for range 4 {
		require.NoError(t, <-errs)
	}

	ops.mu.Lock()
	defer ops.mu.Unlock()
	require.Equal(t, 3, ops.batch)
	require.Len(t, ops.links, 2)
	seen := map[string]bool{ops.req: true}
	for _, l := range ops.links {
		seen[l] = true
	}
	require.Equal(t, want, seen)
	g.mu.Lock()
	defer g.mu.Unlock()
	require.Equal(t, []string{"slot", ops.req}, g.reqs, "the batch statement carries the opener's values")
}
