package wire_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
)

func TestBackupMethods(t *testing.T) {
	ts := startServer(t, nil)
	c := dial(t, ts.Addr)
	ctx := context.Background()
	// Enough data for several chunks.
	value := bytes.Repeat([]byte("v"), 100_000)
	for i := range 40 {
		if _, err := c.Put(ctx, []byte(fmt.Sprintf("k%02d", i)), value, fencekv.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	l, err := c.Acquire(ctx, "L", 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}

	err = c.Call(ctx, "backup_read", map[string]any{"offset": 0}, nil)
	if !errors.Is(err, fencekv.ErrBadRequest) {
		t.Fatalf("backup_read with no backup open: %v; want bad_request", err)
	}
	b, err := c.Backup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b.LastToken != l.Token || b.Revision != 40 || b.Size < 3<<20 {
		t.Fatalf("backup = index %d, last token %d, revision %d, size %d; want token %d, revision 40, over 3 MiB",
			b.Index, b.LastToken, b.Revision, b.Size, l.Token)
	}
	first := make([]byte, 10)
	if _, err := io.ReadFull(b, first); err != nil {
		t.Fatal(err)
	}
	// The client read the first chunk: reading elsewhere is refused, and
	// names the next offset.
	err = c.Call(ctx, "backup_read", map[string]any{"offset": 5}, nil)
	var fe *fencekv.Error
	if !errors.As(err, &fe) || fe.Code != fencekv.CodeBadRequest || !bytes.Contains([]byte(fe.Message), []byte(fmt.Sprint(1<<20))) {
		t.Fatalf("backup_read out of order: %v; want bad_request naming offset %d", err, 1<<20)
	}
	rest, err := io.ReadAll(b)
	if err != nil {
		t.Fatalf("reading the backup: %v", err)
	}
	if got := int64(len(first) + len(rest)); got != b.Size {
		t.Fatalf("read %d bytes of a %d-byte backup", got, b.Size)
	}
	b.Close()
	// Read to its end, the backup is released.
	err = c.Call(ctx, "backup_read", map[string]any{"offset": b.Size}, nil)
	if !errors.Is(err, fencekv.ErrBadRequest) {
		t.Fatalf("backup_read after the end: %v; want bad_request", err)
	}
	if err := c.Call(ctx, "backup_read", nil, nil); !errors.Is(err, fencekv.ErrBadRequest) {
		t.Fatalf("backup_read without offset: %v; want bad_request", err)
	}
}
