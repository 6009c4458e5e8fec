package fencehttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/fence/fencehttp"
	"github.com/pgfence/pgfence/internal/pgtest"
)

type testBundle struct {
	db     *pgtest.DB
	srv    *httptest.Server
	called int
	errs   []error
}

// setup starts a service whose POST /notes inserts the request body as a
// note in the request's transaction. The query string may ask the handler
// to fail after writing (fail=1: 500, panic=1, commit=1: call Commit), or
// to write a second note with the same id, which a deferred constraint
// refuses at commit (dup=1).
func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{db: pgtest.NewDB(t)}
	_, err := b.db.Pool.Exec(context.Background(), `CREATE TABLE notes (
		id int, body text NOT NULL, token bigint NOT NULL,
		CONSTRAINT notes_id UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)
	mw, err := fencehttp.New(fencehttp.Config{DB: b.db.Pool, OnError: func(_ *http.Request, err error) { b.errs = append(b.errs, err) }})
	require.NoError(t, err)
	b.srv = httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.called++
		ctx := r.Context()
		tx := fencehttp.Tx(ctx)
		acc, ok := fencehttp.FromContext(ctx)
		if tx == nil || !ok {
			http.Error(w, "no transaction", http.StatusTeapot)
			return
		}
		body, _ := io.ReadAll(r.Body)
		q := r.URL.Query()
		n := 1
		if q.Get("dup") != "" {
			n = 2
		}
		for range n {
			if _, err := tx.Exec(ctx, "INSERT INTO notes VALUES (1, $1, $2)", string(body), acc.Token); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		switch {
		case q.Get("fail") != "":
			http.Error(w, "handler failed", http.StatusInternalServerError)
			return
		case q.Get("panic") != "":
			panic(http.ErrAbortHandler)
		case q.Get("commit") != "":
			if err := tx.Commit(ctx); err != nil {
				http.Error(w, err.Error(), http.StatusConflict)
				return
			}
		}
		w.Header().Set("Note-Resource", acc.Resource)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "saved")
	})))
	t.Cleanup(b.srv.Close)
	return b
}

// post sends body with the given header values (none when nil) and returns
// the status, the body and the response.
func (b *testBundle) post(t *testing.T, query, body string, headers map[string][]string) (int, string, *http.Response) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/notes?"+query, strings.NewReader(body))
	require.NoError(t, err)
	for k, vs := range headers {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := b.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(got), resp
}

// fenced returns the headers of lease name with token.
func fenced(name, token string) map[string][]string {
	return map[string][]string{fencehttp.TokenHeader: {token}, fencehttp.LeaseHeader: {url.PathEscape(name)}}
}

// notes returns the notes' bodies.
func (b *testBundle) notes(t *testing.T) []string {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), "SELECT body FROM notes ORDER BY body")
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// highest reads the registry's highest token for resource (0: none).
func (b *testBundle) highest(t *testing.T, resource string) int64 {
	t.Helper()
	var tok int64
	err := b.db.Pool.QueryRow(context.Background(),
		"SELECT token FROM pgfence.pgfence_fence_registry WHERE resource = $1", resource).Scan(&tok)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	require.NoError(t, err)
	return tok
}

// TestBadHeaders: every request without a well-formed token and lease name
// is answered by the middleware (428 when both are missing, else 400),
// with a body naming the problem; the handler never runs and nothing is
// written or registered.
func TestBadHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	long := strings.Repeat("n", fence.MaxResourceName+1)
	for _, tc := range []struct {
		name    string
		headers map[string][]string
		status  int
		msg     string
	}{
		{"none", nil, http.StatusPreconditionRequired, "request carries no fencing token: send Pgfence-Token and Pgfence-Lease"},
		{"no lease", map[string][]string{fencehttp.TokenHeader: {"5"}}, http.StatusBadRequest, "Pgfence-Token sent without Pgfence-Lease"},
		{"no token", map[string][]string{fencehttp.LeaseHeader: {"n"}}, http.StatusBadRequest, "Pgfence-Lease sent without Pgfence-Token"},
		{"two tokens", map[string][]string{fencehttp.TokenHeader: {"5", "6"}, fencehttp.LeaseHeader: {"n"}}, http.StatusBadRequest, "once each"},
		{"two leases", map[string][]string{fencehttp.TokenHeader: {"5"}, fencehttp.LeaseHeader: {"n", "m"}}, http.StatusBadRequest, "once each"},
		{"word", fenced("n", "five"), http.StatusBadRequest, `malformed Pgfence-Token "five"`},
		{"zero", fenced("n", "0"), http.StatusBadRequest, `malformed Pgfence-Token "0"`},
		{"negative", fenced("n", "-5"), http.StatusBadRequest, `malformed Pgfence-Token "-5"`},
		{"plus", fenced("n", "+5"), http.StatusBadRequest, `malformed Pgfence-Token "+5"`},
		{"leading zero", fenced("n", "05"), http.StatusBadRequest, `malformed Pgfence-Token "05"`},
		{"empty token", fenced("n", ""), http.StatusBadRequest, `malformed Pgfence-Token ""`},
		{"overflow", fenced("n", "9223372036854775808"), http.StatusBadRequest, "malformed Pgfence-Token"},
		{"fraction", fenced("n", "5.0"), http.StatusBadRequest, "malformed Pgfence-Token"},
		{"empty lease", fenced("", "5"), http.StatusBadRequest, "empty Pgfence-Lease"},
		{"bad escape", map[string][]string{fencehttp.TokenHeader: {"5"}, fencehttp.LeaseHeader: {"a%zz"}}, http.StatusBadRequest, "malformed Pgfence-Lease"},
		{"not utf-8", map[string][]string{fencehttp.TokenHeader: {"5"}, fencehttp.LeaseHeader: {"%ff"}}, http.StatusBadRequest, "not UTF-8"},
		{"too long", fenced(long, "5"), http.StatusBadRequest, "513 bytes long"},
	} {
		status, body, resp := b.post(t, "", "x", tc.headers)
		require.Equal(t, tc.status, status, tc.name)
		require.Equal(t, "pgfence: ", body[:9], tc.name)
		require.Contains(t, body, tc.msg, tc.name)
		require.Equal(t, "text/plain; charset=utf-8", resp.Header.Get("Content-Type"), tc.name)
	}
	require.Zero(t, b.called)
	require.Empty(t, b.notes(t))
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM pgfence.pgfence_fence_registry").Scan(&n))
	require.Zero(t, n)

	// Control: the same request, well formed, reaches the handler.
	status, body, _ := b.post(t, "", "x", fenced("n", "5"))
	require.Equal(t, http.StatusCreated, status, body)
	require.Equal(t, 1, b.called)
}

// TestAcceptAndReject: an accepted token's writes commit with the raise and
// the handler's response passes through; an older token is answered 409
// with a body that says why and the highest token in a header, and
// CheckResponse maps it to ErrFenced. Names are percent-encoded.
func TestAcceptAndReject(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const name = "orders/eu west ünïcode"
	status, body, resp := b.post(t, "", "from 2048", fenced(name, "2048"))
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, "saved", body)
	require.Equal(t, name, resp.Header.Get("Note-Resource"))
	require.Equal(t, []string{"from 2048"}, b.notes(t))
	require.Equal(t, int64(2048), b.highest(t, name))

	status, body, resp = b.post(t, "", "from 1024", fenced(name, "1024"))
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, `pgfence: stale fencing token 1024 for resource "orders/eu west ünïcode", which has seen 2048: `+
		"a newer lock holder has written; this holder's lock was lost\n", body)
	require.Equal(t, "2048", resp.Header.Get(fencehttp.CurrentTokenHeader))
	err := fencehttp.CheckResponse(resp)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	var stale *fence.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, fence.StaleTokenError{Resource: name, Presented: 1024, Current: 2048}, *stale)
	require.Equal(t, 1, b.called, "the handler never saw the stale request")
	require.Equal(t, []string{"from 2048"}, b.notes(t))
	require.Empty(t, b.errs)
}

// TestHandlerFailureRollsBack: a handler answering 400 or more, panicking,
// or whose writes fail at commit leaves nothing written and the registry
// unraised; a handler cannot commit the transaction itself. The control
// (the same request without the failure) commits.
func TestHandlerFailureRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	status, body, _ := b.post(t, "fail=1", "failed", fenced("n", "4096"))
	require.Equal(t, http.StatusInternalServerError, status)
	require.Equal(t, "handler failed\n", body, "the handler's own response")

	req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/notes?panic=1", strings.NewReader("panicked"))
	require.NoError(t, err)
	for k, v := range fenced("n", "4096") {
		req.Header[k] = v
	}
	_, err = b.srv.Client().Do(req)
	require.Error(t, err, "a panicking handler's connection is closed")

	status, body, _ = b.post(t, "dup=1", "dup", fenced("n", "4096"))
	require.Equal(t, http.StatusInternalServerError, status)
	require.Equal(t, "pgfence: the request's transaction did not commit\n", body)
	require.Len(t, b.errs, 1)
	require.ErrorContains(t, b.errs[0], "notes_id")

	status, body, _ = b.post(t, "commit=1", "self-committed", fenced("n", "4096"))
	require.Equal(t, http.StatusConflict, status)
	require.Contains(t, body, "the middleware ends the request's transaction")

	require.Empty(t, b.notes(t))
	require.Zero(t, b.highest(t, "n"), "every raise was rolled back")
	require.Equal(t, 4, b.called)

	// Control.
	status, _, _ = b.post(t, "", "kept", fenced("n", "4096"))
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, []string{"kept"}, b.notes(t))
	require.Equal(t, int64(4096), b.highest(t, "n"))
}

// TestDatabaseDown: a check that cannot reach the database is answered 503
// without running the handler, and the cause reaches OnError.
func TestDatabaseDown(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	pool := db.NewPool(t, nil)
	pool.Close()
	var errs []error
	mw, err := fencehttp.New(fencehttp.Config{DB: pool, OnError: func(_ *http.Request, err error) { errs = append(errs, err) }})
	require.NoError(t, err)
	called := false
	h := mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true }))
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	for k, v := range fenced("n", "5") {
		req.Header[k] = v
	}
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, "pgfence: the fence check could not begin\n", rec.Body.String())
	require.False(t, called)
	require.Len(t, errs, 1)

	_, err = fencehttp.New(fencehttp.Config{})
	require.ErrorContains(t, err, "Config.DB is nil")
	_, err = fencehttp.New(fencehttp.Config{DB: pool, Schema: strings.Repeat("s", 64)})
	require.ErrorContains(t, err, "not a PostgreSQL identifier")
}

// TestResourceMapping: Config.Resource decides the resource; its error is a
// 400 with its text.
func TestResourceMapping(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	mw, err := fencehttp.New(fencehttp.Config{DB: db.Pool, Resource: func(r *http.Request, lease string) (string, error) {
		if lease != "billing" {
			return "", errors.New("this service takes writes from lease billing only")
		}
		return "billing:" + r.URL.Path, nil
	}})
	require.NoError(t, err)
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		acc, _ := fencehttp.FromContext(r.Context())
		_, _ = io.WriteString(w, acc.Resource)
	}))
	serve := func(lease string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPut, "/invoices", nil)
		for k, v := range fenced(lease, "7") {
			req.Header[k] = v
		}
		h.ServeHTTP(rec, req)
		return rec
	}
	rec := serve("billing")
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "billing:/invoices", rec.Body.String())
	rec = serve("orders")
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.Equal(t, "pgfence: this service takes writes from lease billing only\n", rec.Body.String())
}
