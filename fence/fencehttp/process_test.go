//go:build unix

package fencehttp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence/fencehttp"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/sysproc"
	"github.com/pgfence/pgfence/leasetable"
)

// childEnv, when set, makes the test binary run a child process instead of
// the tests: "service" or "holder".
const childEnv = "PGFENCE_FENCEHTTP_CHILD"

// The children's settings.
const (
	dbEnv      = "PGFENCE_FENCEHTTP_DB"      // the child's database URL
	fencedEnv  = "PGFENCE_FENCEHTTP_FENCED"  // service: "1" wraps the handler in the middleware
	serviceEnv = "PGFENCE_FENCEHTTP_SERVICE" // holder: the service's address
)

// stockDDL is the service's table.
const stockDDL = `CREATE TABLE stock (sku text PRIMARY KEY, n int NOT NULL)`

// setStockSQL sets the stock of apples.
const setStockSQL = `INSERT INTO stock VALUES ('apple', $1) ON CONFLICT (sku) DO UPDATE SET n = excluded.n`

func runChild(role string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv(dbEnv))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer pool.Close()
	if role == "service" {
		err = service(ctx, pool)
	} else {
		err = holder(ctx, pool)
	}
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	return 0
}

// service serves PUT /stock, setting the stock to the body, fenced or not,
// until its stdin closes.
func service(ctx context.Context, pool *pgxpool.Pool) error {
	var h http.Handler
	body := func(r *http.Request) (int, error) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(string(b))
	}
	if os.Getenv(fencedEnv) == "1" {
		mw, err := fencehttp.New(fencehttp.Config{DB: pool})
		if err != nil {
			return err
		}
		h = mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, err := body(r)
			if err == nil {
				_, err = fencehttp.Tx(r.Context()).Exec(r.Context(), setStockSQL, n)
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
		}))
	} else {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, err := body(r)
			if err == nil {
				_, err = pool.Exec(r.Context(), setStockSQL, n)
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
		})
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); _ = srv.Close() }()
	fmt.Println("listening", ln.Addr())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// holder takes lease "stock" (waiting for it) and reports its token, then
// obeys its stdin: "prepare N" checks that the lease is held and builds a
// request setting the stock to N; "send" sends it and reports the status.
func holder(ctx context.Context, pool *pgxpool.Pool) error {
	k, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: time.Second, DisableListen: true})
	if err != nil {
		return err
	}
	defer k.Close()
	lease, err := k.Acquire(ctx, "stock", nil)
	if err != nil {
		return err
	}
	fmt.Println("acquired", lease.Token())
	var req *http.Request
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd := strings.Fields(in.Text())
		switch cmd[0] {
		case "prepare":
			if err := lease.Err(); err != nil {
				return err
			}
			req, err = http.NewRequestWithContext(ctx, http.MethodPut, "http://"+os.Getenv(serviceEnv)+"/stock", strings.NewReader(cmd[1]))
			if err != nil {
				return err
			}
			fencehttp.SetHeaders(req.Header, lease)
			fmt.Println("prepared")
		case "send":
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			_ = resp.Body.Close()
			fmt.Println("status", resp.StatusCode, errors.Is(fencehttp.CheckResponse(resp), pgfence.ErrFenced))
		}
	}
	return in.Err()
}

// child is a running child process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan []string
}

// startChild starts the test binary as a child of role with env, stopped
// and killed when t ends.
func startChild(t *testing.T, role string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+role), env...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	sysproc.SetParentDeathSignal(cmd.SysProcAttr, syscall.SIGKILL)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &child{cmd: cmd, stdin: stdin, lines: make(chan []string, 16)}
	go func() {
		defer close(c.lines)
		s := bufio.NewScanner(out)
		for s.Scan() {
			c.lines <- strings.Fields(s.Text())
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return c
}

// next returns the child's next line, failing t when it ends first or
// takes over 30 seconds.
func (c *child) next(t *testing.T, want string) []string {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		require.True(t, ok, "%s: the child's output ended", want)
		require.NotEmpty(t, l)
		require.Equal(t, want, l[0], "the child said %q", l)
		return l
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: the child said nothing for 30s", want)
		return nil
	}
}

// say writes a line to the child's stdin.
func (c *child) say(t *testing.T, line string) {
	t.Helper()
	_, err := io.WriteString(c.stdin, line+"\n")
	require.NoError(t, err)
}

// TestPausedHolderLateWrite runs the story with real processes: holders
// share a lease in one database; a service process keeps its data and the
// fence registry in a second. Holder 1 takes the lease and prepares a write
// (its lease is held), then is stopped (SIGSTOP) past its TTL; holder 2
// takes the lease and writes 10 through the service; holder 1 resumes and
// sends its write of 99. With the middleware the late write is answered
// 409 and the stock stays 10. The control runs the same service without
// the middleware: the late write is accepted and holder 2's update is lost.
func TestPausedHolderLateWrite(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		fenced bool
	}{{"fenced", true}, {"control without middleware", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			locks, data := pgtest.NewDB(t), pgtest.NewDB(t)
			_, err := data.Pool.Exec(ctx, stockDDL)
			require.NoError(t, err)
			fenced := map[bool]string{true: "1", false: "0"}[tc.fenced]
			svc := startChild(t, "service", dbEnv+"="+data.URL, fencedEnv+"="+fenced)
			addr := svc.next(t, "listening")[1]

			first := startChild(t, "holder", dbEnv+"="+locks.URL, serviceEnv+"="+addr)
			firstToken, err := strconv.ParseInt(first.next(t, "acquired")[1], 10, 64)
			require.NoError(t, err)
			first.say(t, "prepare 99")
			first.next(t, "prepared")
			require.NoError(t, first.cmd.Process.Signal(syscall.SIGSTOP))

			second := startChild(t, "holder", dbEnv+"="+locks.URL, serviceEnv+"="+addr)
			secondToken, err := strconv.ParseInt(second.next(t, "acquired")[1], 10, 64)
			require.NoError(t, err)
			require.Greater(t, secondToken, firstToken)
			second.say(t, "prepare 10")
			second.next(t, "prepared")
			second.say(t, "send")
			require.Equal(t, []string{"status", "200", "false"}, second.next(t, "status"))

			require.NoError(t, first.cmd.Process.Signal(syscall.SIGCONT))
			first.say(t, "send")
			late := first.next(t, "status")

			var n int
			require.NoError(t, data.Pool.QueryRow(ctx, "SELECT n FROM stock WHERE sku = 'apple'").Scan(&n))
			if tc.fenced {
				require.Equal(t, []string{"status", "409", "true"}, late, "the late write is rejected")
				require.Equal(t, 10, n, "holder 2's write is kept")
				var highest int64
				require.NoError(t, data.Pool.QueryRow(ctx, "SELECT token FROM pgfence.pgfence_fence_registry WHERE resource = 'stock'").Scan(&highest))
				require.Equal(t, secondToken, highest)
			} else {
				require.Equal(t, []string{"status", "200", "false"}, late, "control: the late write is accepted")
				require.Equal(t, 99, n, "control: holder 2's write is lost")
			}
			for _, c := range []*child{first, second, svc} {
				require.NoError(t, c.stdin.Close())
				require.NoError(t, c.cmd.Wait())
			}
		})
	}
}
