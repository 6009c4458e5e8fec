package fencehttp

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
)

// TokenHeader carries the holder's fencing token, in decimal.
const TokenHeader = "Pgfence-Token"

// LeaseHeader carries the lease's name, percent-encoded as a URL path
// segment (url.PathEscape).
const LeaseHeader = "Pgfence-Lease"

// CurrentTokenHeader is set on a 409 rejection to the highest token the
// resource has seen.
const CurrentTokenHeader = "Pgfence-Current-Token"

// SetHeaders sets lease's token and name on h, replacing any already set.
func SetHeaders(h http.Header, lease pgfence.Lease) {
	h.Set(TokenHeader, strconv.FormatInt(lease.Token(), 10))
	h.Set(LeaseHeader, url.PathEscape(lease.Name()))
}

// Transport sends every request with its Lease's headers. Once the lease
// has ended it sends nothing and fails with the lease's error (matching
// pgfence.ErrLeaseLost or pgfence.ErrNotHeld); a holder that does not yet
// know it lost the lease is stopped by the service's check instead.
type Transport struct {
	// Lease is the lease whose token and name are sent.
	Lease pgfence.Lease
	// Base sends the requests; nil means http.DefaultTransport.
	Base http.RoundTripper
}

// RoundTrip sends a copy of req with the lease's headers set.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := t.Lease.Err(); err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, fmt.Errorf("fencehttp: lease %q: %w", t.Lease.Name(), err)
	}
	out := req.Clone(req.Context())
	SetHeaders(out.Header, t.Lease)
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(out)
}

// CheckResponse returns a *fence.StaleTokenError (matching pgfence.ErrFenced)
// when resp is the middleware's 409 rejection of its request's token (its
// Resource is the lease name the request sent), and nil for any other
// response. It reads only the headers.
func CheckResponse(resp *http.Response) error {
	if resp.StatusCode != http.StatusConflict || resp.Header.Get(CurrentTokenHeader) == "" {
		return nil
	}
	e := &fence.StaleTokenError{}
	e.Current, _ = strconv.ParseInt(resp.Header.Get(CurrentTokenHeader), 10, 64)
	if resp.Request != nil {
		e.Presented, _ = strconv.ParseInt(resp.Request.Header.Get(TokenHeader), 10, 64)
		e.Resource, _ = url.PathUnescape(resp.Request.Header.Get(LeaseHeader))
	}
	return e
}
