package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// This file and wipe.go are the only places where the agent writes to a
// block device: here the data of a thick clone, copied from its source LV
// into the clone's new LV (lvmd cannot snapshot a thick LV). It copies only a source nobody has
// open, holds it exclusively while it copies, and verifies what it wrote
// before the clone may be answered.

// copyChunk is the unit of the copy: large, so that each O_DIRECT read and
// write is one big request, and a multiple of any logical block size.
const copyChunk = 8 << 20

// copyBuffers: chunks in flight, one in each of copyChunks' three stages
// and a spare, so that a read never waits for a hash (make bench-node
// BENCH=clone times the copy beside dd; docs/benchmarks.md).
const copyBuffers = 4

// ErrSourceInUse: the clone's source is open (a Pod uses it, or a mount or
// another reader has it), so its data may be changing: no copy now.
var ErrSourceInUse = errors.New("the source volume is in use")

// openCounter reads how many openers a device-mapper device has: the
// kernel's open count of the LV's device (Devices, through
// lvmbackend/devmapper; a fake in tests).
type openCounter interface {
	OpenCount(ctx context.Context, major, minor uint32) (int32, error)
}

// device is a block device to copy: its path and device numbers.
type device struct {
	path         string
	major, minor uint32
}

// copyVolume copies the first size bytes of src to dst and verifies them:
// only while src's open count is 0 (ErrSourceInUse otherwise) and dst's
// too, with src
// opened exclusively (O_EXCL: a mount cannot take it meanwhile) and both
// opened for direct I/O, then dst flushed and read back, each chunk's
// 64-bit xxHash compared with the source's. After the copy, src must still have
// no opener but this one, or the copy does not count (a Block-mode Pod,
// which opens without O_EXCL, may have written meanwhile). progress is told
// the bytes copied after each chunk. Any error leaves dst partly written:
// the caller never answers a clone whose copy did not return nil, and a
// retry copies again from the start.
func copyVolume(ctx context.Context, oc openCounter, src, dst device, size int64, progress func(done int64)) error {
	if n, err := oc.OpenCount(ctx, src.major, src.minor); err != nil {
		return fmt.Errorf("read the open count of %s: %w", src.path, err)
	} else if n > 0 {
		return fmt.Errorf("%w: %s has %d openers", ErrSourceInUse, src.path, n)
	}
	// Nor is a clone's volume that something has open ever written (a
	// request asked again for a clone in use).
	if n, err := oc.OpenCount(ctx, dst.major, dst.minor); err != nil {
		return fmt.Errorf("read the open count of %s: %w", dst.path, err)
	} else if n > 0 {
		return fmt.Errorf("the clone's volume %s has %d openers: it is not written", dst.path, n)
	}
	in, err := openDirect(src.path, unix.O_RDONLY|unix.O_EXCL)
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("%w: %s is held exclusively (mounted?)", ErrSourceInUse, src.path)
	} else if err != nil {
		return err
	}
	defer in.Close()
	out, err := openDirect(dst.path, unix.O_WRONLY|unix.O_EXCL)
	if err != nil {
		return fmt.Errorf("the clone's volume: %w", err)
	}
	defer out.Close()
	sums, err := copyChunks(ctx, in, out, size, progress)
	if err != nil {
		return err
	}
	if err := out.Sync(); err != nil {
		return fmt.Errorf("flush %s: %w", dst.path, err)
	}
	if n, err := oc.OpenCount(ctx, src.major, src.minor); err != nil {
		return fmt.Errorf("read the open count of %s: %w", src.path, err)
	} else if n > 1 {
		return fmt.Errorf("%w: %s was opened during the copy (%d openers); the copy does not count", ErrSourceInUse, src.path, n)
	}
	return verify(ctx, dst.path, size, sums)
}

// openDirect opens path with O_DIRECT, or without it where the file
// system refuses it (EINVAL: tmpfs, for the tests' regular files; block
// devices take it).
func openDirect(path string, flags int) (*os.File, error) {
	f, err := os.OpenFile(path, flags|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EINVAL) {
		f, err = os.OpenFile(path, flags|unix.O_CLOEXEC, 0)
	}
	return f, err
}

// alignedBuffer is a page-aligned buffer, as O_DIRECT needs, from an
// anonymous mapping; free returns it.
func alignedBuffer(n int) ([]byte, func(), error) {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, nil, fmt.Errorf("copy buffer: %w", err)
	}
	return b, func() { _ = unix.Munmap(b) }, nil
}

// copyChunks copies size bytes chunk by chunk in three stages that
// overlap, each in its own goroutine: the next chunks are read while one
// is written and the one before is hashed (copyBuffers buffers in
// flight), and returns each chunk's xxHash.
//
// The check is the 64-bit xxHash (cespare/xxhash, already a dependency
// through the Prometheus client): pure Go, fast on any CPU. CRC-32C is fast
// only where the CPU computes it (SSE4.2, arm64's CRC extension); without
// them, or emulated (the test guest's TCG CPU), Go's table-driven CRC-32C
// ran at 106 MB/s, xxHash at 4.2 GB/s, and the CRC made the copy run at
// half of dd's rate. Hashing a chunk after its write, not between its read
// and its write, keeps the hash off the path of the I/O.
func copyChunks(ctx context.Context, in io.ReaderAt, out io.WriterAt, size int64, progress func(int64)) ([]uint64, error) {
	type chunk struct {
		buf []byte
		i   int
	}
	free := make(chan []byte, copyBuffers)
	for range copyBuffers {
		b, release, err := alignedBuffer(copyChunk)
		if err != nil {
			return nil, err
		}
		defer release()
		free <- b
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	send := func(ch chan<- chunk, c chunk) bool {
		select {
		case ch <- c:
			return true
		case <-ctx.Done():
			return false
		}
	}
	sums := make([]uint64, (size+copyChunk-1)/copyChunk)
	read, written := make(chan chunk, copyBuffers), make(chan chunk, copyBuffers)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(read)
		for i := range sums {
			var buf []byte
			select {
			case buf = <-free:
			case <-ctx.Done():
				return
			}
			off := int64(i) * copyChunk
			buf = buf[:min(copyChunk, size-off)]
			if _, err := in.ReadAt(buf, off); err != nil {
				cancel(fmt.Errorf("read the source at %d: %w", off, err))
				return
			}
			if !send(read, chunk{buf, i}) {
				return
			}
		}
	})
	wg.Go(func() {
		defer close(written)
		for c := range read { // until the reader ends, even after an error
			off := int64(c.i) * copyChunk
			if ctx.Err() != nil {
				continue
			} else if _, err := out.WriteAt(c.buf, off); err != nil {
				cancel(fmt.Errorf("write the clone at %d: %w", off, err))
			} else {
				send(written, c)
			}
		}
	})
	for c := range written {
		sums[c.i] = xxhash.Sum64(c.buf)
		progress(int64(c.i)*copyChunk + int64(len(c.buf)))
		free <- c.buf[:cap(c.buf)]
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	return sums, nil
}

// verify reads the first size bytes of path back (direct I/O: from the
// device, not the page cache) and compares each chunk's xxHash with sums.
func verify(ctx context.Context, path string, size int64, sums []uint64) error {
	f, err := openDirect(path, unix.O_RDONLY)
	if err != nil {
		return fmt.Errorf("read the clone back: %w", err)
	}
	defer f.Close()
	buf, release, err := alignedBuffer(copyChunk)
	if err != nil {
		return err
	}
	defer release()
	for i, off := 0, int64(0); off < size; i, off = i+1, off+copyChunk {
		if err := ctx.Err(); err != nil {
			return err
		}
		b := buf[:min(copyChunk, size-off)]
		if _, err := f.ReadAt(b, off); err != nil {
			return fmt.Errorf("read the clone back at %d: %w", off, err)
		}
		if xxhash.Sum64(b) != sums[i] {
			return fmt.Errorf("the clone differs from its source in the %d bytes at offset %d after the copy", len(b), off)
		}
	}
	return nil
}

// ReasonSourceInUse is the event of a thick clone waiting for its source
// to be free (retried with backoff).
const ReasonSourceInUse = "SourceInUse"

// fill copies a thick clone's source LV into its new LV dst, verified,
// then answers created. Progress is an event at each 10 % and
// lvm_agent_clone_copied_bytes_total. A source in use is a wait
// (SourceInUse), any other failure a retry that copies from the start.
func (a *Agent) fill(ctx context.Context, pvc *corev1.PersistentVolumeClaim, src, dst *lvmbackend.Volume) outcome {
	dstPath, err := a.devicePath(ctx, dst)
	if err != nil {
		return retry(err)
	}
	if src.Path == "" || dstPath == "" || src.DevMajor == 0 && src.DevMinor == 0 || dst.DevMajor == 0 && dst.DevMinor == 0 {
		return retry(fmt.Errorf("the device of LV %s or of its clone %s is not known yet (inactive?)", src.Name, dst.Name))
	}
	size := src.SizeBytes
	var last, next int64 = 0, 10
	start := time.Now()
	var written time.Time // the last chunk written: the copy's end, the check's start
	progress := func(done int64) {
		a.metrics.copied.Add(float64(done - last))
		last, written = done, time.Now()
		if pct := done * 100 / size; pct >= next {
			a.recorder.Eventf(pvc, corev1.EventTypeNormal, "CloneCopying", "copied %d%% of LV %s (%d of %d bytes)", pct, src.Name, done, size)
			next = pct/10*10 + 10
		}
	}
	// Not bounded by one lvmd call's timeout: at least 1 MiB/s.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.OpTimeout+time.Duration(size>>20)*time.Second)
	defer cancel()
	err = copyVolume(cctx, a.cfg.openCounts,
		device{filepath.Join(a.cfg.deviceRoot, src.Path), src.DevMajor, src.DevMinor},
		device{filepath.Join(a.cfg.deviceRoot, dstPath), dst.DevMajor, dst.DevMinor}, size, progress)
	switch {
	case errors.Is(err, ErrSourceInUse):
		return outcome{reason: ReasonSourceInUse, err: fmt.Errorf("the clone waits for its source to be free (no Pod using it): %w", err)}
	case err != nil:
		return retry(fmt.Errorf("copy of LV %s into %s: %w; it is copied again from the start", src.Name, dst.Name, err))
	}
	// The clone's part beyond its source's size is zeroed: its extents
	// may have held anything (freed before the agent zeroed what it
	// removes, or by a class with wipe: none, or by hand).
	if dst.SizeBytes > size && a.cfg.Wiper != nil {
		err := a.cfg.Wiper.zero(cctx, filepath.Join(a.cfg.deviceRoot, dstPath), dst.DeviceClass+"/"+dst.Name, size, dst.SizeBytes, a.metrics)
		if err != nil {
			return retry(fmt.Errorf("zero the %d bytes of clone %s beyond its source's size: %w; it is copied again from the start", dst.SizeBytes-size, dst.Name, err))
		}
	}
	a.recorder.Eventf(pvc, corev1.EventTypeNormal, "CloneCopied", "copied and verified the %d bytes of LV %s", size, src.Name)
	// make bench-node's clone row reads this line (the copy's rate beside dd's).
	copied, checked := written.Sub(start), time.Since(written)
	klog.InfoS("Clone copied and verified", "claim", klog.KObj(pvc), "source", src.Name, "lv", dst.Name, "bytes", size,
		"copy", copied, "verify", checked, "copyMiBps", fmt.Sprintf("%.1f", float64(size)/(1<<20)/copied.Seconds()))
	return a.created(ctx, dst)
}
