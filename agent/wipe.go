package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// The wipe: a thick LV's extents hold whatever was last written to them,
// and lvcreate zeroes only a new LV's first 4 KiB, so a deleted volume's
// bytes would show in the next volume made on its extents (a Block claim
// reads them raw). The agent zeroes a thick LV before it asks lvmd to
// remove it: extents go back to the volume group only once they are zero.
// Beside the thick copy (copy.go), this is the agent's other write to a
// block device.
//
// It happens in the delete, before lvremove, and the PV is answered
// deleted only after both: the LV stays where it is, its claim's tag on it,
// until it is zero, so it is never handed to another claim (no lvcreate
// can take extents an LV holds), never counted as free capacity (lvm
// counts it used), and an agent killed or a node cut off mid-wipe finds the
// PV still deleting when it starts again and zeroes the LV again from the
// start. The price is a delete that takes as long as the wipe: the
// provisioner's wait for the answer ends at its deadline and is asked
// again, which the agent's workqueue takes as the same request.

// wipeChunk is one BLKZEROOUT call: small enough that the rate limit and a
// cancel act within a fraction of a second, large enough that each call is
// a big request for the device.
const wipeChunk = 32 << 20

// Wiper zeroes LVs before their removal: how fast, and the counts.
type Wiper struct {
	// limit bounds the bytes zeroed per second, over every wipe of the
	// node at once (nil: no bound).
	limit *rate.Limiter

	mu     sync.Mutex
	active map[string]wipeProgress // by device path
}

type wipeProgress struct {
	lv          string
	done, total int64
	since       time.Time
}

// NewWiper bounds wipes to bytesPerSecond in all (0: no bound), so that the
// node's running volumes keep their throughput while a large volume is
// zeroed.
func NewWiper(bytesPerSecond int64) *Wiper {
	w := &Wiper{active: map[string]wipeProgress{}}
	if bytesPerSecond > 0 {
		w.limit = rate.NewLimiter(rate.Limit(bytesPerSecond), max(wipeChunk, int(min(bytesPerSecond, 1<<30))))
	}
	return w
}

// WipeStatus is one wipe in progress (make bench-wipe waits on it; the
// operator sees a wipe as volume status's "wiping" row and in the metrics).
type WipeStatus struct {
	LV          string
	Done, Total int64
	Since       time.Time
}

// Wiping lists the wipes in progress.
func (w *Wiper) Wiping() []WipeStatus {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]WipeStatus, 0, len(w.active))
	for _, p := range w.active {
		out = append(out, WipeStatus{LV: p.lv, Done: p.done, Total: p.total, Since: p.since})
	}
	return out
}

// ErrVolumeOpen: the LV to be wiped is open (a Pod or a mount still has
// it); it is neither wiped nor removed until it is let go.
var ErrVolumeOpen = errors.New("the volume is still open")

// wipeBeforeRemove zeroes lv, a thick LV about to be removed, unless it
// needs no wipe: a thin LV (its pool zeroes new chunks: checked at
// create), one tagged kube.NoWipeTag (its class said wipe: none), or an
// agent that cannot write block devices (it publishes no "wipe" on its
// Node, so no provisioner of lvm-agent asked it for a zeroing class; it
// says so once at start).
func (a *Agent) wipeBeforeRemove(ctx context.Context, pv *corev1.PersistentVolume, lv *lvmbackend.Volume, t target) (outcome, bool) {
	if lv.Thin() || lv.HasTag(kube.NoWipeTag) || a.cfg.Wiper == nil || a.cfg.openCounts == nil {
		return outcome{}, true
	}
	path, err := a.devicePath(ctx, lv)
	if err != nil {
		return retry(err), false
	}
	if path == "" || lv.DevMajor == 0 && lv.DevMinor == 0 {
		// lvmd cannot activate it; removed as it is, its extents would
		// hand its bytes to the next volume.
		return retry(fmt.Errorf("LV %s (device class/name) has no active device, and it is zeroed before it is removed: activate it (lvchange -ay VG/%s), or remove it by hand if the next volume may read its data", t, t.name)), false
	}
	switch n, err := a.cfg.openCounts.OpenCount(ctx, lv.DevMajor, lv.DevMinor); {
	case err != nil:
		return retry(fmt.Errorf("read the open count of %s before its wipe: %w", path, err)), false
	case n > 0:
		return retry(fmt.Errorf("%w: LV %s has %d openers; it is zeroed and removed once they let go", ErrVolumeOpen, t, n)), false
	}
	start := time.Now()
	// Not bounded by one lvmd call's timeout: the wipe's own rate, or at
	// least 1 MiB/s.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.OpTimeout+time.Duration(lv.SizeBytes>>20)*time.Second)
	defer cancel()
	err = a.cfg.Wiper.zero(wctx, filepath.Join(a.cfg.deviceRoot, path), t.String(), 0, lv.SizeBytes, a.metrics)
	if err != nil {
		return retry(fmt.Errorf("zero LV %s before its removal: %w; it stays until it is zero", t, err)), false
	}
	stepsOf(ctx).done("wipe")
	took := time.Since(start)
	klog.InfoS("LV zeroed before its removal", "pv", klog.KObj(pv), "lv", t, "bytes", lv.SizeBytes, "took", took,
		"MiBps", fmt.Sprintf("%.1f", float64(lv.SizeBytes)/(1<<20)/max(took.Seconds(), 1e-9)))
	return outcome{}, true
}

// zero zeroes the bytes [from, to) of the block device at path, through the
// kernel's BLKZEROOUT (the device's WRITE ZEROES where it has one, else the
// kernel writes zero pages; never a discard, which need not read back as
// zeros), in wipeChunk calls under the rate limit, then flushes the device
// and reads samples back. The device is opened exclusively: nothing can
// mount it meanwhile. Regular files (the tests' devices) are written with
// zeros instead.
func (w *Wiper) zero(ctx context.Context, path, lv string, from, to int64, m *Metrics) error {
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("%w: %s is held exclusively (mounted?)", ErrVolumeOpen, path)
	} else if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	block := st.Mode()&os.ModeDevice != 0
	w.mu.Lock()
	w.active[path] = wipeProgress{lv: lv, total: to - from, since: time.Now()}
	w.mu.Unlock()
	left := float64(to - from)
	m.wipeWaiting.Add(left)
	defer func() {
		w.mu.Lock()
		delete(w.active, path)
		w.mu.Unlock()
		m.wipeWaiting.Sub(left)
	}()
	for done := from; done < to; {
		n := min(wipeChunk, to-done)
		if w.limit != nil {
			if err := w.limit.WaitN(ctx, int(n)); err != nil {
				return err
			}
		} else if err := ctx.Err(); err != nil {
			return err
		}
		if block {
			err = blkZeroOut(f, done, n)
		} else {
			err = writeZeros(f, done, n)
		}
		if err != nil {
			return fmt.Errorf("zero %d bytes at %d of %s: %w", n, done, path, err)
		}
		done += n
		left -= float64(n)
		m.wiped.Add(float64(n))
		m.wipeWaiting.Sub(float64(n))
		w.mu.Lock()
		p := w.active[path]
		p.done = done - from
		w.active[path] = p
		w.mu.Unlock()
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("flush %s: %w", path, err)
	}
	return checkZero(ctx, path, from, to)
}

// blkZeroOut is the BLKZEROOUT ioctl of [off, off+n): x/sys/unix names the
// request but has no wrapper for its argument, a {start, length} pair.
func blkZeroOut(f *os.File, off, n int64) error {
	r := [2]uint64{uint64(off), uint64(n)}
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno unix.Errno
	if err := sc.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, unix.BLKZEROOUT, uintptr(unsafe.Pointer(&r)))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// zeros is a chunk of zeros for writeZeros.
var zeros = make([]byte, 1<<20)

func writeZeros(f *os.File, off, n int64) error {
	for n > 0 {
		k := min(n, int64(len(zeros)))
		if _, err := f.WriteAt(zeros[:k], off); err != nil {
			return err
		}
		off, n = off+k, n-k
	}
	return nil
}

// wipeSamples is how many 4 KiB blocks checkZero reads back at random
// offsets, beside the first and the last: a wipe that skipped a range
// of any size (a chunk) is found with near certainty, without reading
// the whole LV a second time.
const wipeSamples = 64

// checkZero reads back, from the device (direct I/O), the first and last
// 4 KiB blocks of [from, to) (both multiples of 4096) and wipeSamples
// blocks between, and fails on any non-zero byte.
func checkZero(ctx context.Context, path string, from, to int64) error {
	f, err := openDirect(path, unix.O_RDONLY)
	if err != nil {
		return fmt.Errorf("read the wiped volume back: %w", err)
	}
	defer f.Close()
	buf, release, err := alignedBuffer(4096)
	if err != nil {
		return err
	}
	defer release()
	blocks := (to - from) / 4096
	if blocks <= 0 {
		return nil
	}
	offs := []int64{from, from + (blocks-1)*4096}
	for range wipeSamples {
		offs = append(offs, from+rand.Int64N(blocks)*4096)
	}
	for _, off := range offs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := f.ReadAt(buf, off); err != nil {
			return fmt.Errorf("read the wiped volume back at %d: %w", off, err)
		}
		for i, b := range buf {
			if b != 0 {
				return fmt.Errorf("the wiped volume reads byte %#x at offset %d after the wipe", b, off+int64(i))
			}
		}
	}
	return nil
}
