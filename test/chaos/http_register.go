package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence/fencehttp"
)

// HTTPRegister is a [Register] behind an HTTP service ([HTTPRegisterHandler]):
// Read is POST /read, Write is PUT /write, each carrying the token in
// fencehttp's headers. With the middleware (fenced) the service checks the
// token with the fence registry and makes its reads claiming; without it
// (the negative control) it reads and writes whatever the token.
type HTTPRegister struct {
	// URL is the service's base URL.
	URL string
	// Client sends the requests; nil means http.DefaultClient.
	Client *http.Client
	// Lease is the lease name sent; empty means DefaultLockName.
	Lease string
	// Fenced is whether the service runs the middleware (reads claim).
	Fenced bool
}

// Claims implements [Register]: true when fenced.
func (r *HTTPRegister) Claims() bool { return r.Fenced }

// Read implements [Register].
func (r *HTTPRegister) Read(ctx context.Context, token int64) (int64, int64, error) {
	body, err := r.do(ctx, http.MethodPost, "/read", token, "")
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(body)
	if len(f) != 2 {
		return 0, 0, &unknownError{fmt.Errorf("read answered %q", body)}
	}
	val, err1 := strconv.ParseInt(f[0], 10, 64)
	tok, err2 := strconv.ParseInt(f[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, &unknownError{err}
	}
	return val, tok, nil
}

// Write implements [Register].
func (r *HTTPRegister) Write(ctx context.Context, token, value int64) error {
	_, err := r.do(ctx, http.MethodPut, "/write", token, strconv.FormatInt(value, 10))
	return err
}

// do sends one request. A 409 rejection is fenced (matching
// pgfence.ErrFenced), other 4xx and 503 (nothing was written) fail, and a
// transport error or any other status is of unknown outcome.
func (r *HTTPRegister) do(ctx context.Context, method, path string, token int64, body string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, method, r.URL+path, strings.NewReader(body))
	if err != nil {
		return "", &notSentError{err}
	}
	lease := r.Lease
	if lease == "" {
		lease = DefaultLockName
	}
	req.Header.Set(fencehttp.TokenHeader, strconv.FormatInt(token, 10))
	req.Header.Set(fencehttp.LeaseHeader, lease)
	c := r.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", &unknownError{err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", &unknownError{err}
	}
	switch {
	case resp.StatusCode == http.StatusOK:
		return string(b), nil
	case fencehttp.CheckResponse(resp) != nil:
		return "", fencehttp.CheckResponse(resp)
	case resp.StatusCode == http.StatusServiceUnavailable || (resp.StatusCode >= 400 && resp.StatusCode < 500):
		return "", &notSentError{fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(b)))}
	}
	return "", &unknownError{fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(b)))}
}

// Final reads the register's value and token from its table, after a
// workload.
func (r *HTTPRegister) Final(ctx context.Context, db pgfence.DB, table string) (RegisterState, error) {
	var s RegisterState
	err := db.QueryRow(ctx, fmt.Sprintf(registerRead, pgx.Identifier{table}.Sanitize())).Scan(&s.Value, &s.Token)
	return s, err
}

// HTTPRegisterHandler creates table (if missing) with its one row and
// returns the service of an [HTTPRegister] on it. Fenced, it runs behind
// fencehttp's middleware (pgfence installed in pool's database): a read
// claims the row, moving its token to the accepted one, and a write stores
// the value with the token, both in the request's transaction. Unfenced,
// it reads and writes the row whatever the token.
func HTTPRegisterHandler(ctx context.Context, pool *pgxpool.Pool, table string, fenced bool) (http.Handler, error) {
	t := pgx.Identifier{table}.Sanitize()
	if _, err := pool.Exec(ctx, fmt.Sprintf(registerCreate, t)); err != nil {
		return nil, fmt.Errorf("chaos: create register: %w", err)
	}
	serve := func(db pgfence.DB, token func(*http.Request) (int64, error)) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tok, err := token(r)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			ctx := r.Context()
			switch r.URL.Path {
			case "/read":
				q := registerRead
				args := []any{}
				if fenced {
					q, args = `UPDATE %[1]s SET fence_token = $1 WHERE id = 1 RETURNING val, fence_token`, []any{tok}
				}
				var val, rowTok int64
				if err := db.QueryRow(ctx, fmt.Sprintf(q, t), args...).Scan(&val, &rowTok); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				_, _ = fmt.Fprintf(w, "%d %d", val, rowTok)
			case "/write":
				b, _ := io.ReadAll(r.Body)
				val, err := strconv.ParseInt(string(b), 10, 64)
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				if _, err := db.Exec(ctx, fmt.Sprintf(registerUnguardedWrite, t), val, tok); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
				}
			default:
				http.NotFound(w, r)
			}
		})
	}
	if !fenced {
		return serve(pool, func(r *http.Request) (int64, error) {
			return strconv.ParseInt(r.Header.Get(fencehttp.TokenHeader), 10, 64)
		}), nil
	}
	mw, err := fencehttp.New(fencehttp.Config{DB: pool})
	if err != nil {
		return nil, err
	}
	return mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		serve(fencehttp.Tx(r.Context()), func(r *http.Request) (int64, error) {
			acc, _ := fencehttp.FromContext(r.Context())
			return acc.Token, nil
		}).ServeHTTP(w, r)
	})), nil
}
