package diskfault_test

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
)

// tmpfs mounts a tmpfs of size bytes on a new dir, unmounted when the
// test ends (after the processes it starts later are stopped). It skips
// the test where mounting is refused (not root, no CAP_SYS_ADMIN).
func tmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("skipped TestENOSPC: mount -t tmpfs refused (%v: %s); run as root", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// TestENOSPC: a single node's data dir on a 2 MiB tmpfs, filled by puts
// until the kernel answers ENOSPC (no failpoint: the real thing). The
// write that met it is answered unavailable (outcome unknown); every later
// write is refused; /readyz and the log say the disk is full. With the
// tmpfs grown to 64 MiB ("space freed"), a restart recovers every
// acknowledged write and issues no token twice.
func TestENOSPC(t *testing.T) {
	mnt := tmpfs(t, "2m")
	s := newSingle(t, filepath.Join(mnt, "data"))
	s.start()
	cl := mustDial(t, s.addr)
	l, err := cl.Acquire(ctx(t), "a", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	value := bytes.Repeat([]byte("x"), 16<<10)
	acked := map[string]bool{}
	var full error
	for i := 0; i < 1000; i++ {
		k := fmt.Sprintf("k%04d", i)
		_, err := cl.Put(ctx(t), []byte(k), value, fencekv.WriteOptions{Token: l.Token, Lock: "a"})
		if err != nil {
			full = err
			break
		}
		acked[k] = true
	}
	if full == nil {
		t.Fatalf("1000 puts of 16 KiB fit in a 2 MiB tmpfs")
	}
	t.Logf("%d puts acknowledged; then %v", len(acked), full)
	if code(full) != fencekv.CodeUnavailable {
		t.Fatalf("the put that met the full disk: %v, want unavailable", full)
	}
	for i := range 3 {
		if _, err := cl.Put(ctx(t), []byte(fmt.Sprintf("after%d", i)), []byte("x"), fencekv.WriteOptions{}); code(err) != fencekv.CodeUnavailable {
			t.Fatalf("a put after the disk filled: %v, want unavailable", err)
		}
	}
	if _, err := cl.Acquire(ctx(t), "b", time.Minute, nil); code(err) != fencekv.CodeUnavailable {
		t.Fatalf("an acquire after the disk filled: %v, want unavailable", err)
	}
	st, body, err := readyz(s.http)
	if err != nil || st != http.StatusServiceUnavailable || !strings.Contains(body, "no space left on device") {
		t.Errorf("/readyz on a full disk: %d %q %v, want 503 naming ENOSPC", st, body, err)
	}
	waitLog(t, s.log.String, "no space left on device", "refusing writes until restart")

	s.kill()
	if out, err := exec.Command("mount", "-o", "remount,size=64m", mnt).CombinedOutput(); err != nil {
		t.Fatalf("remount: %v: %s", err, out)
	}
	s.start()
	cl = mustDial(t, s.addr)
	for k := range acked {
		e, err := cl.Get(ctx(t), []byte(k))
		if err != nil || !bytes.Equal(e.Value, value) {
			t.Fatalf("acknowledged %s after the restart: %d bytes, %v", k, len(e.Value), err)
		}
	}
	l2, err := cl.Acquire(ctx(t), "c", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token <= l.Token {
		t.Fatalf("after the restart, token %d was issued; %d was granted before", l2.Token, l.Token)
	}
	if _, err := cl.Put(ctx(t), []byte("more"), value, fencekv.WriteOptions{}); err != nil {
		t.Fatalf("a put after the restart with space: %v", err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "data")); err != nil {
		t.Fatal(err)
	}
}
