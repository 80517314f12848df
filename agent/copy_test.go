package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// counts is an openCounter that answers the given counts in turn.
type counts struct {
	mu sync.Mutex
	n  []int32
}

// set replaces the counts to come.
func (c *counts) set(n ...int32) { c.mu.Lock(); c.n = n; c.mu.Unlock() }

func (c *counts) OpenCount(context.Context, uint32, uint32) (int32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n[0]
	if len(c.n) > 1 {
		c.n = c.n[1:]
	}
	return n, nil
}

// volumes writes a source of size random bytes and a larger clone volume
// full of 0xee, as regular files (the copy is the same on block devices,
// with direct I/O).
func volumes(t *testing.T, size int) (src, dst device, data []byte) {
	t.Helper()
	dir := t.TempDir()
	data = make([]byte, size)
	_, err := rand.Read(data)
	require.NoError(t, err)
	src, dst = device{path: filepath.Join(dir, "src"), major: 253, minor: 1}, device{path: filepath.Join(dir, "dst"), major: 253, minor: 2}
	require.NoError(t, os.WriteFile(src.path, data, 0o600))
	require.NoError(t, os.WriteFile(dst.path, bytes.Repeat([]byte{0xee}, size+copyChunk), 0o600))
	return src, dst, data
}

func TestCopyVolume(t *testing.T) {
	size := 2*copyChunk + 3*4096 // not a whole number of chunks
	src, dst, data := volumes(t, size)
	var seen []int64
	require.NoError(t, copyVolume(context.Background(), &counts{n: []int32{0, 0, 1}}, src, dst, int64(size), func(n int64) { seen = append(seen, n) }))
	got, err := os.ReadFile(dst.path)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got[:size]), "the clone starts with the source's bytes")
	assert.Equal(t, bytes.Repeat([]byte{0xee}, copyChunk), got[size:], "and nothing past the source's size is written")
	assert.Equal(t, []int64{copyChunk, 2 * copyChunk, int64(size)}, seen, "progress after each chunk")
}

func TestCopyVolumeSourceInUse(t *testing.T) {
	src, dst, _ := volumes(t, copyChunk)
	err := copyVolume(context.Background(), &counts{n: []int32{1}}, src, dst, copyChunk, func(int64) {})
	require.ErrorIs(t, err, ErrSourceInUse)
	got, err := os.ReadFile(dst.path)
	require.NoError(t, err)
	assert.Equal(t, bytes.Repeat([]byte{0xee}, 2*copyChunk), got, "nothing written")

	// Opened by someone else while it was copied: the copy does not count.
	err = copyVolume(context.Background(), &counts{n: []int32{0, 0, 2}}, src, dst, copyChunk, func(int64) {})
	require.ErrorIs(t, err, ErrSourceInUse)
	assert.ErrorContains(t, err, "opened during the copy")

	// A clone's volume in use is never written.
	require.NoError(t, os.WriteFile(dst.path, bytes.Repeat([]byte{0xee}, 2*copyChunk), 0o600))
	err = copyVolume(context.Background(), &counts{n: []int32{0, 1}}, src, dst, copyChunk, func(int64) {})
	require.ErrorContains(t, err, "the clone's volume "+dst.path+" has 1 openers: it is not written")
	got, err = os.ReadFile(dst.path)
	require.NoError(t, err)
	assert.Equal(t, bytes.Repeat([]byte{0xee}, 2*copyChunk), got)
}

func TestCopyVolumeCancelled(t *testing.T) {
	src, dst, _ := volumes(t, 4*copyChunk)
	ctx, cancel := context.WithCancel(context.Background())
	err := copyVolume(ctx, &counts{n: []int32{0}}, src, dst, 4*copyChunk, func(n int64) {
		if n >= copyChunk {
			cancel()
		}
	})
	require.ErrorIs(t, err, context.Canceled, "a copy cut short is never a success")
}

func TestVerifyFindsADifference(t *testing.T) {
	src, dst, _ := volumes(t, 2*copyChunk)
	require.NoError(t, copyVolume(context.Background(), &counts{n: []int32{0}}, src, dst, 2*copyChunk, func(int64) {}))
	f, err := os.OpenFile(dst.path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{1, 2, 3}, copyChunk+100)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	in, err := os.Open(src.path)
	require.NoError(t, err)
	defer in.Close()
	sums, err := copyChunks(context.Background(), in, discard{}, 2*copyChunk, func(int64) {})
	require.NoError(t, err)
	err = verify(context.Background(), dst.path, 2*copyChunk, sums)
	assert.ErrorContains(t, err, fmt.Sprintf("differs from its source in the %d bytes at offset %d", copyChunk, copyChunk))
}

type discard struct{}

func (discard) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }

// BenchmarkCopyVolume copies (and verifies) 16 chunks between two regular
// files: the copy's own cost (xxHash, buffers, the two passes) on this
// host's file system. The figure that counts is on block devices, beside
// dd, in the guest.
func BenchmarkCopyVolume(b *testing.B) {
	dir := b.TempDir()
	size := 16 * copyChunk
	data := make([]byte, size)
	_, _ = rand.Read(data)
	src, dst := device{path: filepath.Join(dir, "src")}, device{path: filepath.Join(dir, "dst")}
	require.NoError(b, os.WriteFile(src.path, data, 0o600))
	require.NoError(b, os.WriteFile(dst.path, make([]byte, size), 0o600))
	b.SetBytes(int64(size))
	for b.Loop() {
		require.NoError(b, copyVolume(context.Background(), &counts{n: []int32{0}}, src, dst, int64(size), func(int64) {}))
	}
}

// failAt fails the call at offset off, for reads and writes alike.
type failAt struct{ off int64 }

func (f failAt) ReadAt(p []byte, off int64) (int, error) { return f.WriteAt(p, off) }
func (f failAt) WriteAt(p []byte, off int64) (int, error) {
	if off == f.off {
		return 0, errors.New("I/O error")
	}
	return len(p), nil
}

func TestCopyChunksStopsAtAnIOError(t *testing.T) {
	size := int64(8 * copyChunk)
	_, err := copyChunks(context.Background(), failAt{-1}, failAt{2 * copyChunk}, size, func(int64) {})
	assert.EqualError(t, err, fmt.Sprintf("write the clone at %d: I/O error", 2*copyChunk))
	_, err = copyChunks(context.Background(), failAt{3 * copyChunk}, discard{}, size, func(int64) {})
	assert.EqualError(t, err, fmt.Sprintf("read the source at %d: I/O error", 3*copyChunk))
}
