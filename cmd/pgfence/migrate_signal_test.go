package main_test

import (
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// silentServer accepts TCP connections and never answers: a database that
// hangs. A connection is sent on accepted once the client's first message
// arrived; closed receives it once the client has closed it (the server
// reads until EOF).
type silentServer struct {
	ln       net.Listener
	accepted chan net.Conn
	closed   chan net.Conn
}

func newSilentServer(t *testing.T) *silentServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &silentServer{ln: ln, accepted: make(chan net.Conn, 8), closed: make(chan net.Conn, 8)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				// The client's startup message: from then on it waits
				// for an answer that never comes.
				buf := make([]byte, 1024)
				if _, err := c.Read(buf); err == nil {
					s.accepted <- c
				}
				_, _ = io.Copy(io.Discard, c) // never writes; returns at the client's EOF
				s.closed <- c
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
	})
	return s
}

func (s *silentServer) url() string {
	// connect_timeout far beyond the test's bound: only the signal can end
	// the wait.
	return fmt.Sprintf("postgres://nobody@%s/none?sslmode=disable&connect_timeout=3600", s.ln.Addr())
}

// migrate up, down and version on a database that never answers stop on the
// first SIGTERM or SIGINT, with exit status 1 and a message that says so.
func TestMigrateStopsOnSignal(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		sig  syscall.Signal
	}{
		{[]string{"migrate", "up"}, syscall.SIGTERM},
		{[]string{"migrate", "down", "--yes"}, syscall.SIGTERM},
		{[]string{"migrate", "version"}, syscall.SIGINT},
		{[]string{"grant", "app"}, syscall.SIGTERM},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.args, " ", tt.sig), func(t *testing.T) {
			t.Parallel()
			srv := newSilentServer(t)
			b := startPgfence(t, nil, append(tt.args, "--database", srv.url())...)
			conn := <-srv.accepted // it sent its startup message and waits for the answer
			select {
			case <-b.done:
				t.Fatalf("pgfence exited before the signal; stderr: %s", b.stderr.String())
			default:
			}
			require.NoError(t, b.cmd.Process.Signal(tt.sig))
			require.Equal(t, 1, b.wait(t), "stderr: %s", b.stderr.String()) // wait is bounded
			require.Contains(t, b.stderr.String(), "interrupted")
			require.Contains(t, b.stderr.String(), "context canceled")
			require.Equal(t, conn, <-srv.closed, "the connection was closed")
		})
	}
}
