package fencehttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence/fencehttp"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// TestTransport: a Transport sends its lease's token and name, which the
// middleware accepts; once the lease is released it sends nothing and
// fails with the lease's error.
func TestTransport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	locker, err := leasetable.New(ctx, b.db.Pool, &leasetable.Config{DisableListen: true})
	require.NoError(t, err)
	t.Cleanup(locker.Close)
	lease, err := locker.TryAcquire(ctx, "notes writer", nil)
	require.NoError(t, err)

	client := &http.Client{Transport: &fencehttp.Transport{Lease: lease}}
	resp, err := client.Post(b.srv.URL+"/notes", "text/plain", strings.NewReader("held"))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.NoError(t, fencehttp.CheckResponse(resp))
	require.Equal(t, lease.Token(), b.highest(t, "notes writer"))

	require.NoError(t, lease.Release(ctx))
	_, err = client.Post(b.srv.URL+"/notes", "text/plain", strings.NewReader("released"))
	require.ErrorIs(t, err, pgfence.ErrNotHeld)
	require.Equal(t, 1, b.called, "nothing was sent")
	require.Equal(t, []string{"held"}, b.notes(t))
}

// A holder's late write through a service: holder 2 writes, then holder 1,
// whose lock passed to holder 2 while it was paused, is refused.
func Example() {
	db, drop := pgtest.ExampleDB() // a database with pgfence's migrations applied
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, db.URL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE TABLE stock (sku text PRIMARY KEY, n int NOT NULL)"); err != nil {
		panic(err)
	}

	// The service.
	mw, err := fencehttp.New(fencehttp.Config{DB: pool})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		_, err := fencehttp.Tx(r.Context()).Exec(r.Context(),
			"INSERT INTO stock VALUES ('apple', $1) ON CONFLICT (sku) DO UPDATE SET n = excluded.n", string(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})))
	defer srv.Close()

	// Two holders of lease "stock", as the lock strategies hand them out.
	locker, err := leasetable.New(ctx, pool, &leasetable.Config{DisableListen: true})
	if err != nil {
		panic(err)
	}
	defer locker.Close()
	first, err := locker.TryAcquire(ctx, "stock", nil)
	if err != nil {
		panic(err)
	}
	set := func(lease pgfence.Lease, n string) {
		req, _ := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader(n))
		fencehttp.SetHeaders(req.Header, lease) // what Transport does
		resp, err := srv.Client().Do(req)
		if err != nil {
			panic(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		err = fencehttp.CheckResponse(resp)
		fmt.Println(strings.TrimSpace(fmt.Sprintf("%d fenced=%t %s", resp.StatusCode, errors.Is(err, pgfence.ErrFenced), msg)))
	}
	_ = first.Release(ctx) // (first is paused past its TTL, in truth)
	second, err := locker.TryAcquire(ctx, "stock", nil)
	if err != nil {
		panic(err)
	}
	defer second.Release(ctx)
	set(second, "10")
	set(first, "99") // first wakes up and writes late
	var n int
	_ = pool.QueryRow(ctx, "SELECT n FROM stock").Scan(&n)
	fmt.Println("stock:", n)
	// Output:
	// 200 fenced=false
	// 409 fenced=true pgfence: stale fencing token 1 for resource "stock", which has seen 1025: a newer lock holder has written; this holder's lock was lost
	// stock: 10
}
