package lvmbackend

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/lvmd/parser"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

// TestClassifyGoogle: one case per message form google/lvmd or LVM prints,
// and the near misses that must stay untyped (transient for the agent).
func TestClassifyGoogle(t *testing.T) {
	tests := []struct {
		name string
		msg  string
		want error
	}{
		// LV missing (lvm2 tools/toollib.c).
		{"lvs/lvremove, lvm2 2.02.1xx+", `  Failed to find logical volume "vg1/pvc-a"`, ErrNotFound},
		{"lvs/lvremove, older lvm2", "  One or more specified logical volume(s) not found.", ErrNotFound},
		{"fork output after the exit status", "failed to remove lv: exit status 5\nCommandOutput: Failed to find logical volume \"vg1/pvc-a\"", ErrNotFound},

		// VG missing (lvm2 lib/metadata/metadata.c, tools/toollib.c).
		{"lvs/lvcreate", "failed to create lv: exit status 5\nCommandOutput: Volume group \"vg9\" not found\n  Cannot process volume group vg9", ErrUnknownDeviceClass},
		{"with a full stop", `  Volume group "vg9" not found.`, ErrUnknownDeviceClass},
		{"at the end of the text", `Volume group "vg9" not found`, ErrUnknownDeviceClass},
		{"lvm2 2.02 lvcreate", `  Volume group "vg9" doesn't exist`, ErrUnknownDeviceClass},

		// Not enough space (lvm2 lib/metadata/lv_manip.c, thin_manip.c).
		{"lvcreate, VG free extents", `  Volume group "vg1" has insufficient free space (15 extents): 16 required.`, ErrInsufficientCapacity},
		{"allocation", "  Insufficient free space: 256 extents needed, but only 124 available", ErrInsufficientCapacity},
		{"allocation, suitable extents", "  Insufficient suitable allocatable extents for logical volume pvc-a: 3 more required", ErrInsufficientCapacity},
		{"allocation, contiguous", "  Insufficient suitable contiguous allocatable extents for logical volume pvc-a: 3 more required", ErrInsufficientCapacity},
		{"allocation, found", "  Insufficient suitable allocatable extents found for logical volume pvc-a.", ErrInsufficientCapacity},
		{"thin pool threshold on create", "  Cannot create new thin volume, free space in thin pool vg1/pool reached threshold.", ErrInsufficientCapacity},
		{"thin pool data threshold", "  Threshold configured for free data space in thin pool vg1/pool has been reached (95.00% >= 95.00%).", ErrInsufficientCapacity},
		{"thin pool metadata threshold", "  Threshold configured for free metadata space in thin pool vg1/pool has been reached (80.00% > 75.00%).", ErrInsufficientCapacity},

		// google/lvmd's own messages (server/server.go, commands/commands.go, parser/parser.go).
		{"parser: inactive LV's kernel major", `failed to list LVs: strconv.ParseUint: parsing "-1": invalid syntax`, ErrUnparsableListing},
		{"parser: empty report or warning line", "failed to list LVs: expected 9 components, got 1", ErrUnparsableListing},
		{"parser: vgs", "failed to list LVs: expected 5 components, got 1", ErrUnparsableListing},
		{"parser: remove's lookup", `failed to remove lv: failed to list LVs: strconv.ParseUint: parsing "-1": invalid syntax`, ErrUnparsableListing},
		{"parser: component", "failed to list LVs: failed to parse component 'LVM2_LV_NAME=x'", ErrUnparsableListing},
		{"parser: attributes", "failed to list LVs: incorrect attrs block size, expected 10, got 9 in -wi-a----", ErrUnparsableListing},
		{"size 0", "failed to create lv: size must be greater than 0", ErrInvalidArgument},

		// Refusals for good (lvm2 lib/misc/lvm-string.c, lib/metadata/lv_manip.c; topolvm lvmd).
		{"reserved name part", `  Names including "_cvol" are reserved. Please choose a different LV name.`, ErrInvalidArgument},
		{"reserved prefix", `  Names starting "snapshot" are reserved. Please choose a different LV name.`, ErrInvalidArgument},
		{"name exists", `  Logical Volume "pvc-a" already exists in volume group "vg1"`, ErrExists},
		{"topolvm lvmd option class", "unsupported lvcreate-option-class target: raid9", ErrInvalidArgument},

		// Near misses.
		{"bare exit status: settled by a probe, not by text", "failed to create lv: exit status 5", nil},
		{"damaged VG is not a missing one", `  Volume group "vg1" not found, is inconsistent or has PVs missing.`, nil},
		{"VG not readable (lock) is not a missing one", "  Can't get lock for vg1\n  Cannot process volume group vg1", nil},
		{"VG lock failure", "  Cannot access VG vg1 due to failed lock.", nil},
		{"overprovisioning warning on success", "  WARNING: Sum of all thin volume sizes (2.00 GiB) exceeds the size of thin pool vg1/pool (1.00 GiB).", nil},
		{"insufficient memory", "  Insufficient memory to stack mknod operation", nil},
		{"insufficient target space", "  Insufficient space for target parameters.", nil},
		{"thin pool missing", "  Thin pool volume pool not found in Volume group vg1.", nil},
		{"PV missing", "  PV /dev/sdz not found in VG vg1.", nil},
		{"LV in use", "  Logical volume vg1/pvc-a contains a filesystem in use.", nil},
		{"protected", "failed to remove lv: volume is protected", nil},
		{"ambiguous lookup", "failed to remove lv: expected 1 LV, got 2", nil},
		{"no lvm on the daemon's PATH", `failed to list LVs: exec: "lvs": executable file not found in $PATH`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, classifyGoogle(tc.msg))
		})
	}
}

func TestBareExit(t *testing.T) {
	tests := []struct {
		msg  string
		want bool
	}{
		{"failed to create lv: exit status 5", true},
		{"failed to remove lv: failed to list LVs: exit status 5", true},
		{"failed to list LVs: exit status 5\nCommandOutput: []", true},
		{"failed to remove lv: exit status 5\nCommandOutput: ", true},
		{"failed to create lv: exit status 5\nCommandOutput: Logical Volume \"a\" already exists in volume group \"vg1\"", false},
		{"failed to create lv: size must be greater than 0", false},
		{"failed to create lv: signal: killed", false},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, bareExit(tc.msg), tc.msg)
	}
	assert.True(t, emptyReport("failed to list LVs: expected 9 components, got 1"))
	assert.True(t, emptyReport("failed to list LVs: expected 9 components, got 1\nCommandOutput: []"))
	assert.False(t, emptyReport("failed to list LVs: expected 9 components, got 10"))
}

func TestGoogleErrorCodes(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"unavailable", status.Error(codes.Unavailable, "connection refused"), ErrUnavailable},
		{"deadline", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), ErrUnavailable},
		{"canceled", status.Error(codes.Canceled, "context canceled"), ErrUnavailable},
		{"context error", context.DeadlineExceeded, ErrUnavailable},
		{"internal with LVM text", status.Error(codes.Internal, "failed to remove lv: exit status 5\nCommandOutput: Failed to find logical volume \"vg1/a\""), ErrNotFound},
		{"internal, bare", status.Error(codes.Internal, "failed to create lv: exit status 5"), nil},
		{"not google/lvmd at that address", status.Error(codes.Unimplemented, "unknown service lvm.LVM"), nil},
		{"not a status", errors.New("boom"), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, _ := googleError("op", tc.err)
			assert.Equal(t, tc.want, e.Kind)
			assert.Equal(t, "op", e.Op)
		})
	}
}

// TestGoogleAttr checks that the lv_attr string survives the daemon's
// decoding (its own parser) and our re-encoding, but for the health column.
func TestGoogleAttr(t *testing.T) {
	for _, attr := range []string{"-wi-a-----", "-wi-ao----", "Vwi-a-tz--", "twi-aotz--", "ewi-------", "-ri-a----s", "mwi-a-m---"} {
		line := "LVM2_LV_NAME='a'<:SEP:>LVM2_LV_SIZE='4194304'<:SEP:>LVM2_LV_UUID='u'<:SEP:>LVM2_LV_ATTR='" + attr +
			"'<:SEP:>LVM2_COPY_PERCENT=''<:SEP:>LVM2_LV_KERNEL_MAJOR='253'<:SEP:>LVM2_LV_KERNEL_MINOR='0'<:SEP:>LVM2_LV_TAGS=''<:SEP:>LVM2_VG_NAME='vg1'"
		lv, err := parser.ParseLV(line)
		require.NoError(t, err)
		v := googleVolume("vg1", lv.ToProto())
		assert.Equal(t, attr, v.Attr)
		assert.Nil(t, v.Tags, "an empty lv_tags is no tag")
	}
	assert.Equal(t, "", googleAttr(nil))
}

func startGoogleFake(t *testing.T, m *lvmdfake.LVM, poll time.Duration) (*GoogleLVMD, *lvmdfake.Google) {
	t.Helper()
	srv := lvmdfake.NewGoogle(m)
	addr, err := srv.Serve("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	b, err := NewGoogleLVMD(addr, nil, poll)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b, srv
}

// TestGoogleLVMD covers what only the google/lvmd backend does.
func TestGoogleLVMD(t *testing.T) {
	ctx := context.Background()
	model := func() *lvmdfake.LVM {
		return lvmdfake.NewLVM(lvmdfake.Class{Name: "vg1", SizeBytes: 64 << 20},
			lvmdfake.Class{Name: "thin", SizeBytes: 64 << 20, Thin: true, Overprovision: 2})
	}
	tests := []struct {
		name string
		run  func(t *testing.T, b *GoogleLVMD, m *lvmdfake.Google)
	}{
		{"an empty volume group lists as empty, not as a parse failure", func(t *testing.T, b *GoogleLVMD, _ *lvmdfake.Google) {
			vols, err := b.ListVolumes(ctx, "vg1")
			require.NoError(t, err)
			assert.NotNil(t, vols)
			assert.Empty(t, vols)
		}},
		{"a thin volume group cannot be listed, says why, and lookups still work", func(t *testing.T, b *GoogleLVMD, m *lvmdfake.Google) {
			_, err := m.Create("thin", "pvc-t", 4<<20, nil)
			require.NoError(t, err)
			_, err = b.ListVolumes(ctx, "thin")
			require.ErrorIs(t, err, ErrUnparsableListing)
			assert.NotErrorIs(t, err, ErrNotFound)
			assert.Contains(t, err.Error(), "lvol0_pmspare")
			v, err := b.GetVolume(ctx, "thin", "pvc-t")
			require.NoError(t, err)
			assert.Equal(t, "Vwi-a-tz--", v.Attr)
		}},
		{"a protected volume is refused untyped and stays", func(t *testing.T, b *GoogleLVMD, m *lvmdfake.Google) {
			_, err := m.Create("vg1", "pvc-p", 4<<20, []string{"protected"})
			require.NoError(t, err)
			err = b.RemoveVolume(ctx, "vg1", "pvc-p")
			require.Error(t, err)
			var e *Error
			require.ErrorAs(t, err, &e)
			assert.Nil(t, e.Kind)
			assert.Contains(t, err.Error(), "volume is protected")
			_, err = b.GetVolume(ctx, "vg1", "pvc-p")
			assert.NoError(t, err)
		}},
		{"a failing lvremove is not taken for a missing volume", func(t *testing.T, b *GoogleLVMD, m *lvmdfake.Google) {
			_, err := m.Create("vg1", "pvc-a", 4<<20, nil)
			require.NoError(t, err)
			m.SetHook(func(op, _, _ string) error {
				if op == "remove" {
					return errors.New("exit status 5") // lvremove: LV in use
				}
				return nil
			})
			err = b.RemoveVolume(ctx, "vg1", "pvc-a")
			require.Error(t, err)
			assert.NotErrorIs(t, err, ErrNotFound)
		}},
		{"requests the daemon cannot carry are invalid", func(t *testing.T, b *GoogleLVMD, _ *lvmdfake.Google) {
			for _, req := range []CreateRequest{
				{DeviceClass: "vg1", Name: "a", SizeBytes: 4096, OptionClass: "raid1"},
				{DeviceClass: "vg1", Name: "a", SizeBytes: 4097},
				{DeviceClass: "vg1", Name: "a", SizeBytes: 0},
				{DeviceClass: "vg1", Name: "-rf", SizeBytes: 4096},
				{DeviceClass: "vg1", Name: "a/b", SizeBytes: 4096},
				{DeviceClass: "", Name: "a", SizeBytes: 4096},
			} {
				_, err := b.CreateVolume(ctx, req)
				assert.ErrorIs(t, err, ErrInvalidArgument, "%+v", req)
			}
			_, err := b.GetVolume(ctx, "vg1", "a b")
			assert.ErrorIs(t, err, ErrInvalidArgument)
			assert.ErrorIs(t, b.RemoveVolume(ctx, "vg1/x", "a"), ErrInvalidArgument)
		}},
		{"watch calls back only on change", func(t *testing.T, b *GoogleLVMD, m *lvmdfake.Google) {
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			var calls atomic.Int32
			done := make(chan error, 1)
			go func() { done <- b.WatchCapacity(wctx, func([]Capacity) { calls.Add(1) }) }()
			require.Eventually(t, func() bool { return calls.Load() == 1 }, time.Second, time.Millisecond)
			// Several polls without a change: lvmd has taken three more, so
			// the client has compared at least two answers after the first.
			polls := m.Calls("ListVG")
			require.Eventually(t, func() bool { return m.Calls("ListVG") >= polls+3 }, 5*time.Second, time.Millisecond)
			assert.EqualValues(t, 1, calls.Load())
			_, err := m.Create("vg1", "pvc-a", 4<<20, nil)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return calls.Load() == 2 }, time.Second, time.Millisecond)
			cancel()
			assert.ErrorIs(t, <-done, context.Canceled)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, srv := startGoogleFake(t, model(), 2*time.Millisecond)
			tc.run(t, b, srv)
		})
	}
}

func TestGoogleWatchStopsWhenTheDaemonDoes(t *testing.T) {
	b, srv := startGoogleFake(t, lvmdfake.NewLVM(lvmdfake.Class{Name: "vg1", SizeBytes: 64 << 20}), 2*time.Millisecond)
	first := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- b.WatchCapacity(context.Background(), func([]Capacity) { first <- struct{}{} })
	}()
	<-first
	srv.Stop()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, ErrUnavailable)
	case <-time.After(3 * time.Second):
		t.Fatal("WatchCapacity kept going with the daemon gone")
	}
}

func TestNewGoogleLVMD(t *testing.T) {
	b, err := NewGoogleLVMD("127.0.0.1:1", nil, 0)
	require.NoError(t, err, "connecting is lazy")
	assert.Equal(t, DefaultPollInterval, b.poll)
	_, err = b.Capacity(context.Background())
	assert.ErrorIs(t, err, ErrUnavailable)
	require.NoError(t, b.Close())

	_, err = NewGoogleLVMD("", nil, 0)
	assert.Error(t, err)
	_, err = NewGoogleLVMD("127.0.0.1:1", nil, -time.Second)
	assert.Error(t, err)
}

// pki writes a CA and a server and a client certificate signed by it.
type pki struct {
	dir                                    string
	caPool                                 *x509.CertPool
	server                                 tls.Certificate
	caFile, clientCert, clientKey, garbage string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	p.caPool = x509.NewCertPool()
	p.caPool.AddCert(ca)

	issue := func(serial int64, usage x509.ExtKeyUsage, ips ...net.IP) ([]byte, *ecdsa.PrivateKey) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "test"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		require.NoError(t, err)
		return der, key
	}
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(p.dir, name)
		require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return path
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte {
		der, err := x509.MarshalECPrivateKey(k)
		require.NoError(t, err)
		return der
	}

	srvDER, srvKey := issue(2, x509.ExtKeyUsageServerAuth, net.IPv4(127, 0, 0, 1))
	p.server, err = tls.LoadX509KeyPair(write("server.crt", "CERTIFICATE", srvDER), write("server.key", "EC PRIVATE KEY", keyDER(srvKey)))
	require.NoError(t, err)
	cliDER, cliKey := issue(3, x509.ExtKeyUsageClientAuth)
	p.clientCert = write("client.crt", "CERTIFICATE", cliDER)
	p.clientKey = write("client.key", "EC PRIVATE KEY", keyDER(cliKey))
	p.caFile = write("ca.crt", "CERTIFICATE", caDER)
	p.garbage = filepath.Join(p.dir, "garbage.pem")
	require.NoError(t, os.WriteFile(p.garbage, []byte("not a certificate"), 0o600))
	return p
}

func TestLoadClientTLS(t *testing.T) {
	p := newPKI(t)

	t.Run("errors", func(t *testing.T) {
		for name, files := range map[string][3]string{
			"certificate without key": {p.clientCert, "", p.caFile},
			"key without certificate": {"", p.clientKey, p.caFile},
			"missing certificate":     {filepath.Join(p.dir, "nope.crt"), p.clientKey, p.caFile},
			"missing CA":              {p.clientCert, p.clientKey, filepath.Join(p.dir, "nope.crt")},
			"CA without a PEM block":  {p.clientCert, p.clientKey, p.garbage},
		} {
			_, err := LoadClientTLS(files[0], files[1], files[2])
			assert.Error(t, err, name)
		}
	})

	t.Run("mutual TLS with the daemon", func(t *testing.T) {
		srv := lvmdfake.NewGoogle(lvmdfake.NewLVM(lvmdfake.Class{Name: "vg1", SizeBytes: 64 << 20}))
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{p.server}, ClientAuth: tls.RequireAndVerifyClientCert,
			ClientCAs: p.caPool, MinVersion: tls.VersionTLS12}
		addr, err := srv.Serve("127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(srv.Stop)

		cfg, err := LoadClientTLS(p.clientCert, p.clientKey, p.caFile)
		require.NoError(t, err)
		b, err := NewGoogleLVMD(addr, cfg, 0)
		require.NoError(t, err)
		defer b.Close()
		caps, err := b.Capacity(context.Background())
		require.NoError(t, err)
		assert.Equal(t, []Capacity{{DeviceClass: "vg1", SizeBytes: 64 << 20, FreeBytes: 64 << 20}}, caps)

		// Without a client certificate the daemon refuses the connection.
		cfg, err = LoadClientTLS("", "", p.caFile)
		require.NoError(t, err)
		anon, err := NewGoogleLVMD(addr, cfg, 0)
		require.NoError(t, err)
		defer anon.Close()
		_, err = anon.Capacity(context.Background())
		assert.Error(t, err)

		// Nor does a plaintext client get anywhere.
		plain, err := NewGoogleLVMD(addr, nil, 0)
		require.NoError(t, err)
		defer plain.Close()
		_, err = plain.Capacity(context.Background())
		assert.Error(t, err)
	})
}
