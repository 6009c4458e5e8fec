package fencehttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
)

// Beginner begins transactions: *pgxpool.Pool and *pgx.Conn satisfy it.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Config configures a [Middleware].
type Config struct {
	// DB begins each request's transaction, in a database where pgfence is
	// installed (the service's own, or the holders'). Required.
	DB Beginner
	// TxOptions are the transaction's options; the zero value is READ
	// COMMITTED, read-write.
	TxOptions pgx.TxOptions
	// Schema is the schema pgfence is installed in; empty means "pgfence".
	Schema string
	// Resource names the registry resource a request writes, given the
	// lease name it sent; nil means the lease name. An error refuses the
	// request with 400 and the error's text.
	Resource func(r *http.Request, lease string) (string, error)
	// OnError, when set, is told of the database errors behind 503 and 500
	// answers and of failed rollbacks.
	OnError func(r *http.Request, err error)
}

// Middleware checks the fencing token of each request against the fence
// registry and runs its handler in the transaction of the check.
type Middleware struct {
	cfg Config
}

// New returns a Middleware for cfg, or an error when cfg.DB is nil or
// cfg.Schema is not a valid identifier. It sends nothing to the database.
func New(cfg Config) (*Middleware, error) {
	if cfg.DB == nil {
		return nil, errors.New("fencehttp: Config.DB is nil")
	}
	if cfg.Schema == "" {
		cfg.Schema = pgfence.DefaultSchema
	}
	if len(cfg.Schema) > 63 || strings.IndexByte(cfg.Schema, 0) >= 0 {
		return nil, fmt.Errorf("fencehttp: Config.Schema %q is not a PostgreSQL identifier", cfg.Schema)
	}
	return &Middleware{cfg: cfg}, nil
}

// Accepted is what the middleware accepted for a request.
type Accepted struct {
	// Lease is the lease name the request sent.
	Lease string
	// Resource is the registry resource checked.
	Resource string
	// Token is the accepted token.
	Token int64
}

// fenced is what a wrapped handler's context carries.
type fenced struct {
	tx  pgx.Tx
	acc Accepted
}

type ctxKey struct{}

// Tx returns the transaction of the request whose context is ctx, inside a
// handler wrapped by [Middleware.Wrap]; nil elsewhere. Its Commit and
// Rollback fail: the middleware ends it.
func Tx(ctx context.Context) pgx.Tx {
	if f, ok := ctx.Value(ctxKey{}).(*fenced); ok {
		return f.tx
	}
	return nil
}

// FromContext returns what the middleware accepted for the request whose
// context is ctx, and false outside a wrapped handler.
func FromContext(ctx context.Context) (Accepted, bool) {
	f, ok := ctx.Value(ctxKey{}).(*fenced)
	if !ok {
		return Accepted{}, false
	}
	return f.acc, true
}

// handlerTx is the transaction as the handler sees it.
type handlerTx struct{ pgx.Tx }

var errHandlerEnds = errors.New("fencehttp: the middleware ends the request's transaction: return a status below 400 to commit, 400 or more to roll back")

func (handlerTx) Commit(context.Context) error   { return errHandlerEnds }
func (handlerTx) Rollback(context.Context) error { return errHandlerEnds }

// tokenRE is a positive decimal int64 candidate, without sign or spaces.
var tokenRE = regexp.MustCompile(`^[1-9][0-9]{0,18}$`)

// parse reads the request's headers; status is 0 when they are good.
func parse(r *http.Request) (lease string, token int64, status int, msg string) {
	toks, leases := r.Header.Values(TokenHeader), r.Header.Values(LeaseHeader)
	switch {
	case len(toks) == 0 && len(leases) == 0:
		return "", 0, http.StatusPreconditionRequired, fmt.Sprintf("request carries no fencing token: send %s and %s", TokenHeader, LeaseHeader)
	case len(toks) == 0:
		return "", 0, http.StatusBadRequest, fmt.Sprintf("%s sent without %s", LeaseHeader, TokenHeader)
	case len(leases) == 0:
		return "", 0, http.StatusBadRequest, fmt.Sprintf("%s sent without %s", TokenHeader, LeaseHeader)
	case len(toks) > 1 || len(leases) > 1:
		return "", 0, http.StatusBadRequest, fmt.Sprintf("send %s and %s once each", TokenHeader, LeaseHeader)
	}
	var err error
	if !tokenRE.MatchString(toks[0]) {
		err = errors.New("not a positive decimal integer")
	} else {
		token, err = strconv.ParseInt(toks[0], 10, 64)
	}
	if err != nil {
		return "", 0, http.StatusBadRequest, fmt.Sprintf("malformed %s %q: want a fencing token, a positive decimal int64", TokenHeader, toks[0])
	}
	lease, err = url.PathUnescape(leases[0])
	switch {
	case err != nil:
		return "", 0, http.StatusBadRequest, fmt.Sprintf("malformed %s: %v", LeaseHeader, err)
	case lease == "":
		return "", 0, http.StatusBadRequest, fmt.Sprintf("empty %s", LeaseHeader)
	case len(lease) > fence.MaxResourceName:
		return "", 0, http.StatusBadRequest, fmt.Sprintf("%s is %d bytes long; lease names have at most %d", LeaseHeader, len(lease), fence.MaxResourceName)
	case !utf8.ValidString(lease):
		return "", 0, http.StatusBadRequest, fmt.Sprintf("%s is not UTF-8 once decoded", LeaseHeader)
	}
	return lease, token, 0, ""
}

// Wrap returns a handler that checks each request's token and runs next in
// the check's transaction, committing or rolling back as the package
// documentation says.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lease, token, status, msg := parse(r)
		if status != 0 {
			refuse(w, status, msg)
			return
		}
		resource := lease
		if m.cfg.Resource != nil {
			var err error
			if resource, err = m.cfg.Resource(r, lease); err != nil {
				refuse(w, http.StatusBadRequest, err.Error())
				return
			}
			if resource == "" || len(resource) > fence.MaxResourceName {
				m.fail(w, r, http.StatusInternalServerError, "Config.Resource named no valid resource",
					fmt.Errorf("resource %q is not 1 to %d bytes long", resource, fence.MaxResourceName))
				return
			}
		}
		ctx := r.Context()
		tx, err := m.cfg.DB.BeginTx(ctx, m.cfg.TxOptions)
		if err != nil {
			m.fail(w, r, http.StatusServiceUnavailable, "the fence check could not begin", err)
			return
		}
		ended := false
		defer func() {
			if !ended {
				m.rollback(r, tx)
			}
		}()
		if err := fence.CheckResource(ctx, tx, resource, token, &fence.ResourceOpts{Schema: m.cfg.Schema}); err != nil {
			var stale *fence.StaleTokenError
			if errors.As(err, &stale) {
				m.rollback(r, tx)
				ended = true
				rejectStale(w, stale)
				return
			}
			m.fail(w, r, http.StatusServiceUnavailable, "the fence check failed", err)
			return
		}
		f := &fenced{tx: handlerTx{tx}, acc: Accepted{Lease: lease, Resource: resource, Token: token}}
		buf := &bufferedWriter{header: http.Header{}}
		next.ServeHTTP(buf, r.WithContext(context.WithValue(ctx, ctxKey{}, f)))
		ended = true
		if buf.status() >= 400 {
			m.rollback(r, tx)
			buf.send(w)
			return
		}
		if err := tx.Commit(ctx); err != nil {
			var stale *fence.StaleTokenError
			if errors.As(fence.Classify(err), &stale) {
				stale.Resource = resource
				rejectStale(w, stale)
				return
			}
			m.fail(w, r, http.StatusInternalServerError, "the request's transaction did not commit", err)
			return
		}
		buf.send(w)
	})
}

// rollback ends tx under a short timeout of its own.
func (m *Middleware) rollback(r *http.Request, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
	defer cancel()
	if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) && m.cfg.OnError != nil {
		m.cfg.OnError(r, fmt.Errorf("fencehttp: rollback: %w", err))
	}
}

// fail answers status with msg and tells OnError of err.
func (m *Middleware) fail(w http.ResponseWriter, r *http.Request, status int, msg string, err error) {
	if m.cfg.OnError != nil {
		m.cfg.OnError(r, fmt.Errorf("fencehttp: %s: %w", msg, err))
	}
	refuse(w, status, msg)
}

// rejectStale answers 409 for a stale token.
func rejectStale(w http.ResponseWriter, stale *fence.StaleTokenError) {
	w.Header().Set(CurrentTokenHeader, strconv.FormatInt(stale.Current, 10))
	refuse(w, http.StatusConflict, fmt.Sprintf("stale fencing token %d for resource %q, which has seen %d: "+
		"a newer lock holder has written; this holder's lock was lost", stale.Presented, stale.Resource, stale.Current))
}

// refuse answers status with a plain-text body.
func refuse(w http.ResponseWriter, status int, msg string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, "pgfence: %s\n", msg)
}

// bufferedWriter holds a handler's response until its transaction ends.
type bufferedWriter struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header { return b.header }

func (b *bufferedWriter) WriteHeader(code int) {
	if b.code == 0 && code >= 200 {
		b.code = code
	}
}

func (b *bufferedWriter) Write(p []byte) (int, error) {
	if b.code == 0 {
		b.code = http.StatusOK
	}
	return b.body.Write(p)
}

// status is the handler's status: 200 when it wrote none.
func (b *bufferedWriter) status() int {
	if b.code == 0 {
		return http.StatusOK
	}
	return b.code
}

// send writes the held response to w.
func (b *bufferedWriter) send(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range b.header {
		h[k] = v
	}
	w.WriteHeader(b.status())
	_, _ = w.Write(b.body.Bytes())
}
