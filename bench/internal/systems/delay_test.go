package systems

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

func TestDelayedDialDelaysWrites(t *testing.T) {
	const d = 30 * time.Millisecond
	client, server := net.Pipe()
	defer server.Close()
	dial := delayedDial(func(context.Context, string, string) (net.Conn, error) { return client, nil }, d)
	c, err := dial(context.Background(), "tcp", "db:5432")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, 5)
		_, _ = io.ReadFull(server, b)
		got <- b
		_, _ = server.Write([]byte("pong"))
	}()
	// time.Sleep waits at least d: the write cannot return sooner.
	start := time.Now()
	if _, err := c.Write([]byte("query")); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < d {
		t.Fatalf("write returned after %v, before the delay of %v", el, d)
	}
	if b := <-got; string(b) != "query" {
		t.Fatalf("server read %q, want %q", b, "query")
	}
	// The answer comes back through the wrapped connection unchanged.
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "pong" {
		t.Fatalf("read %q, %v; want %q", b, err, "pong")
	}
}

func TestDelayedDialPassesDialErrors(t *testing.T) {
	refused := errors.New("connection refused")
	dial := delayedDial(func(context.Context, string, string) (net.Conn, error) { return nil, refused }, time.Millisecond)
	if c, err := dial(context.Background(), "tcp", "db:5432"); !errors.Is(err, refused) || c != nil {
		t.Fatalf("dial = %v, %v; want nil, %v", c, err, refused)
	}
}
