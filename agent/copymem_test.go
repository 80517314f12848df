package agent

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

// procStatus reads the fields of /proc/self/status given, in KiB.
func procStatus(tb testing.TB, fields ...string) map[string]int64 {
	tb.Helper()
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(tb, err)
	out := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		for _, want := range fields {
			if len(f) >= 2 && f[0] == want+":" {
				out[want], err = strconv.ParseInt(f[1], 10, 64)
				require.NoError(tb, err)
			}
		}
	}
	require.Len(tb, out, len(fields), "fields of /proc/self/status")
	return out
}

// vmData is the process's private writable mappings (VmData), in bytes: it
// counts the copy's buffers, which are anonymous mappings outside the Go
// heap, from their mmap to their munmap, touched or not.
func vmData(tb testing.TB) int64 { return procStatus(tb, "VmData")["VmData"] << 10 }

// A copy's buffers are mapped while it runs and unmapped when it returns:
// nothing of them stays between copies.
func TestCopyUnmapsItsBuffers(t *testing.T) {
	size := 2 * copyChunk
	src, dst, _ := volumes(t, size)
	for round := range 2 {
		before := vmData(t)
		var during int64
		require.NoError(t, copyVolume(context.Background(), &counts{n: []int32{0, 0, 1}}, src, dst, int64(size), func(int64) {
			during = max(during, vmData(t))
		}))
		after := vmData(t)
		assert.GreaterOrEqual(t, during-before, int64(copyBuffers*copyChunk), "round %d: the buffers are mapped during the copy", round)
		assert.Less(t, after-before, int64(copyChunk), "round %d: and unmapped once it returns", round)
	}
}

// BenchmarkThickCloneMemory is make bench-memory's thick copy: a clone of
// a 256 MiB thick LV through the agent (lvmd the fake, the devices regular
// files as in the tests: a host without device-mapper cannot give the
// agent binary a source's open count), and this process's memory before,
// at its peak during, and after the copy. The agent is in this process, so
// the absolute figures include the test's (a fake clientset holding the
// objects): the differences are the copy's.
func BenchmarkThickCloneMemory(b *testing.B) {
	const size = 32 * copyChunk
	for i := 0; b.Loop(); i++ {
		root := b.TempDir()
		require.NoError(b, os.MkdirAll(filepath.Join(root, "dev", "vg0"), 0o700))
		e := start(b, Config{openCounts: &counts{n: []int32{0, 0, 1}}, deviceRoot: root})
		require.NoError(b, e.lvm.Add(lvmdfake.LV{Class: "thick", Name: "src", SizeBytes: size, Tags: []string{OwnerTag("src-uid")}}))
		writeRandom(b, filepath.Join(root, "dev", "vg0", "src"), size)
		writeRandom(b, filepath.Join(root, "dev", "vg0", "clone"), size)
		before := memoryNow(b)
		// Reset VmHWM to VmRSS (Linux 4.0+): VmHWM is then the copy's peak.
		require.NoError(b, os.WriteFile("/proc/self/clear_refs", []byte("5"), 0))
		e.pvc(b, "default", fmt.Sprintf("pvc-%d", i), node, cloneSpec("thick", "src", kube.CloneCopy, size))
		err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
			pvc, err := e.client.CoreV1().PersistentVolumeClaims("default").Get(ctx, fmt.Sprintf("pvc-%d", i), metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return pvc.Annotations[kube.AnnLifecycle] != kube.StateCreating, nil
		})
		require.NoError(b, err)
		peak := procStatus(b, "VmHWM")["VmHWM"]
		pvc, err := e.client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), fmt.Sprintf("pvc-%d", i), metav1.GetOptions{})
		require.NoError(b, err)
		require.Equal(b, kube.StateCreated, pvc.Annotations[kube.AnnLifecycle], pvc.Annotations[kube.AnnError])
		after := memoryNow(b)
		mib := func(kib int64) float64 { return float64(kib) / 1024 }
		b.ReportMetric(mib(before.rss), "rss-before-MiB")
		b.ReportMetric(mib(peak), "rss-peak-MiB")
		b.ReportMetric(mib(after.rss), "rss-after-MiB")
		b.ReportMetric(mib(before.anon), "anon-before-MiB")
		b.ReportMetric(mib(after.anon), "anon-after-MiB")
		b.ReportMetric(mib(before.heap), "heap-before-MiB")
		b.ReportMetric(mib(after.heap), "heap-after-MiB")
	}
}

type memoryFigures struct{ rss, anon, heap int64 } // KiB

// memoryNow collects garbage and returns the free pages of the Go heap to
// the kernel first, so that before and after compare what is held (a
// buffer kept, in the heap or mapped, would show in both RSS and anon).
func memoryNow(tb testing.TB) memoryFigures {
	debug.FreeOSMemory()
	s := procStatus(tb, "VmRSS", "RssAnon")
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memoryFigures{rss: s["VmRSS"], anon: s["RssAnon"], heap: int64(ms.HeapInuse >> 10)}
}

// writeRandom writes size random bytes to path, a chunk at a time (a
// whole volume in the heap would be what the benchmark measures).
func writeRandom(tb testing.TB, path string, size int64) {
	tb.Helper()
	f, err := os.Create(path)
	require.NoError(tb, err)
	buf := make([]byte, copyChunk)
	for off := int64(0); off < size; off += copyChunk {
		_, _ = rand.Read(buf)
		_, err := f.WriteAt(buf, off)
		require.NoError(tb, err)
	}
	require.NoError(tb, f.Close())
}
