package lvmdfake_test

import (
	"context"
	"errors"
	"testing"
	"time"

	lvmpb "github.com/google/lvmd/proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

const mib = 1 << 20

func newModel() *lvmdfake.LVM {
	return lvmdfake.NewLVM(
		lvmdfake.Class{Name: "vg1", SizeBytes: 64 * mib},
		lvmdfake.Class{Name: "small", SizeBytes: 8 * mib},
		lvmdfake.Class{Name: "thin", SizeBytes: 64 * mib, Thin: true, Overprovision: 2},
	)
}

func startGoogle(t *testing.T, g *lvmdfake.Google) (lvmpb.LVMClient, string) {
	t.Helper()
	addr, err := g.Serve("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 10 * time.Millisecond,
			Multiplier: 1.6, MaxDelay: 50 * time.Millisecond}, MinConnectTimeout: time.Second}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return lvmpb.NewLVMClient(conn), addr
}

// TestGoogleWireErrors pins the exact messages of the pinned google/lvmd
// (server/server.go wrapping commands/commands.go), and of the forks that
// append LVM's output, for each failure.
func TestGoogleWireErrors(t *testing.T) {
	ctx := context.Background()
	createA := func(t *testing.T, c lvmpb.LVMClient) {
		_, err := c.CreateLV(ctx, &lvmpb.CreateLVRequest{VolumeGroup: "vg1", Name: "a", Size: 4 * mib})
		require.NoError(t, err)
	}
	tests := []struct {
		name       string
		setup      func(t *testing.T, c lvmpb.LVMClient, m *lvmdfake.LVM)
		call       func(c lvmpb.LVMClient) error
		want       string // pinned daemon
		wantOutput string // with CommandOutput ("" = same as want)
	}{
		{
			name: "list of a missing VG",
			call: func(c lvmpb.LVMClient) error {
				_, err := c.ListLV(ctx, &lvmpb.ListLVRequest{VolumeGroup: "nope"})
				return err
			},
			want: "failed to list LVs: exit status 5",
		},
		{
			name: "lookup of a missing LV",
			call: func(c lvmpb.LVMClient) error {
				_, err := c.ListLV(ctx, &lvmpb.ListLVRequest{VolumeGroup: "vg1/nope"})
				return err
			},
			want: "failed to list LVs: exit status 5",
		},
		{
			name: "list of an empty VG: the daemon parses the empty report",
			call: func(c lvmpb.LVMClient) error {
				_, err := c.ListLV(ctx, &lvmpb.ListLVRequest{VolumeGroup: "vg1"})
				return err
			},
			want: "failed to list LVs: expected 9 components, got 1",
		},
		{
			name: "list of a thin VG: [lvol0_pmspare] has kernel major -1",
			call: func(c lvmpb.LVMClient) error {
				_, err := c.ListLV(ctx, &lvmpb.ListLVRequest{VolumeGroup: "thin"})
				return err
			},
			want: `failed to list LVs: strconv.ParseUint: parsing "-1": invalid syntax`,
		},
		{
			name: "create of size 0",
			call: func(c lvmpb.LVMClient) error {
				_, err := c.CreateLV(ctx, &lvmpb.CreateLVRequest{VolumeGroup: "vg1", Name: "a"})
				return err
			},
			want: "failed to create lv: size must be greater than 0",
		},
		{
			name: "create in a missing VG",
			call: func(c lvmpb.LVMClient) error {
				_, err := c.CreateLV(ctx, &lvmpb.CreateLVRequest{VolumeGroup: "nope", Name: "a", Size: mib})
				return err
			},
			want:       "failed to create lv: exit status 5",
			wantOutput: "failed to create lv: exit status 5\nCommandOutput: Volume group \"nope\" not found\n  Cannot process volume group nope",
		},
		{
			name:  "create of an existing name",
			setup: func(t *testing.T, c lvmpb.LVMClient, _ *lvmdfake.LVM) { createA(t, c) },
			call: func(c lvmpb.LVMClient) error {
				_, err := c.CreateLV(ctx, &lvmpb.CreateLVRequest{VolumeGroup: "vg1", Name: "a", Size: mib})
				return err
			},
			want:       "failed to create lv: exit status 5",
			wantOutput: "failed to create lv: exit status 5\nCommandOutput: Logical Volume \"a\" already exists in volume group \"vg1\"",
		},
		{
			name: "create larger than the VG's free space",
			call: func(c lvmpb.LVMClient) error {
				_, err := c.CreateLV(ctx, &lvmpb.CreateLVRequest{VolumeGroup: "small", Name: "a", Size: 8*mib + 1})
				return err
			},
			want:       "failed to create lv: exit status 5",
			wantOutput: "failed to create lv: exit status 5\nCommandOutput: Volume group \"small\" has insufficient free space (2 extents): 3 required.",
		},
		{
			name: "create beyond a thin pool's overprovisioning",
			call: func(c lvmpb.LVMClient) error {
				_, err := c.CreateLV(ctx, &lvmpb.CreateLVRequest{VolumeGroup: "thin", Name: "a", Size: 129 * mib})
				return err
			},
			want:       "failed to create lv: exit status 5",
			wantOutput: "failed to create lv: exit status 5\nCommandOutput: Cannot create new thin volume, free space in thin pool thin/pool reached threshold.",
		},
		{
			name: "remove of a missing LV: the daemon's own lvs fails first",
			call: func(c lvmpb.LVMClient) error {
				_, err := c.RemoveLV(ctx, &lvmpb.RemoveLVRequest{VolumeGroup: "vg1", Name: "nope"})
				return err
			},
			want: "failed to remove lv: failed to list LVs: exit status 5",
		},
		{
			name: "remove in a missing VG",
			call: func(c lvmpb.LVMClient) error {
				_, err := c.RemoveLV(ctx, &lvmpb.RemoveLVRequest{VolumeGroup: "nope", Name: "a"})
				return err
			},
			want: "failed to remove lv: failed to list LVs: exit status 5",
		},
		{
			name: "remove of a protected LV",
			setup: func(t *testing.T, c lvmpb.LVMClient, _ *lvmdfake.LVM) {
				_, err := c.CreateLV(ctx, &lvmpb.CreateLVRequest{VolumeGroup: "vg1", Name: "p", Size: mib, Tags: []string{"protected"}})
				require.NoError(t, err)
			},
			call: func(c lvmpb.LVMClient) error {
				_, err := c.RemoveLV(ctx, &lvmpb.RemoveLVRequest{VolumeGroup: "vg1", Name: "p"})
				return err
			},
			want: "failed to remove lv: volume is protected",
		},
		{
			name: "a failing lvremove (test hook)",
			setup: func(t *testing.T, c lvmpb.LVMClient, m *lvmdfake.LVM) {
				createA(t, c)
				m.SetHook(func(op, _, _ string) error {
					if op == "remove" {
						return errors.New("exit status 5")
					}
					return nil
				})
			},
			call: func(c lvmpb.LVMClient) error {
				_, err := c.RemoveLV(ctx, &lvmpb.RemoveLVRequest{VolumeGroup: "vg1", Name: "a"})
				return err
			},
			want: "failed to remove lv: exit status 5",
		},
	}
	for _, tc := range tests {
		for _, withOutput := range []bool{false, true} {
			name := tc.name
			if withOutput {
				name += "/with CommandOutput"
			}
			t.Run(name, func(t *testing.T) {
				m := newModel()
				g := lvmdfake.NewGoogle(m)
				g.CommandOutput = withOutput
				c, _ := startGoogle(t, g)
				if tc.setup != nil {
					tc.setup(t, c, m)
				}
				err := tc.call(c)
				require.Error(t, err)
				st, ok := status.FromError(err)
				require.True(t, ok)
				assert.Equal(t, codes.Internal, st.Code())
				want := tc.want
				if withOutput && tc.wantOutput != "" {
					want = tc.wantOutput
				}
				assert.Equal(t, want, st.Message())
			})
		}
	}
}

func TestGoogleReports(t *testing.T) {
	ctx := context.Background()
	m := newModel()
	c, _ := startGoogle(t, lvmdfake.NewGoogle(m))

	out, err := c.CreateLV(ctx, &lvmpb.CreateLVRequest{VolumeGroup: "vg1", Name: "a", Size: 10*mib + 1, Tags: []string{"owner=x", "k8s"}})
	require.NoError(t, err)
	assert.Contains(t, out.GetCommandOutput(), `Logical volume "a" created.`)
	_, err = c.CreateLV(ctx, &lvmpb.CreateLVRequest{VolumeGroup: "thin", Name: "t", Size: 8 * mib})
	require.NoError(t, err)

	t.Run("lookup", func(t *testing.T) {
		resp, err := c.ListLV(ctx, &lvmpb.ListLVRequest{VolumeGroup: "vg1/a"})
		require.NoError(t, err)
		require.Len(t, resp.GetVolumes(), 1)
		lv := resp.GetVolumes()[0]
		assert.Equal(t, "a", lv.GetName())
		assert.Equal(t, "vg1", lv.GetVgName())
		assert.EqualValues(t, 12*mib, lv.GetSize(), "rounded up to whole 4 MiB extents")
		assert.Equal(t, []string{"owner=x", "k8s"}, lv.GetTags())
		assert.EqualValues(t, 253, lv.GetActualDevMajorNumber())
		assert.NotEmpty(t, lv.GetUuid())
		// A linear LV's '-' type decodes to MALFORMED_TYPE in the real daemon too.
		assert.Equal(t, lvmpb.LogicalVolume_Attributes_MALFORMED_TYPE, lv.GetAttributes().GetType())
		assert.Equal(t, lvmpb.LogicalVolume_Attributes_WRITEABLE, lv.GetAttributes().GetPermissions())
		assert.Equal(t, lvmpb.LogicalVolume_Attributes_ACTIVE, lv.GetAttributes().GetState())
	})
	t.Run("whole VG", func(t *testing.T) {
		resp, err := c.ListLV(ctx, &lvmpb.ListLVRequest{VolumeGroup: "vg1"})
		require.NoError(t, err)
		require.Len(t, resp.GetVolumes(), 1)
	})
	t.Run("thin volume lookup works where the whole VG does not", func(t *testing.T) {
		resp, err := c.ListLV(ctx, &lvmpb.ListLVRequest{VolumeGroup: "thin/t"})
		require.NoError(t, err)
		require.Len(t, resp.GetVolumes(), 1)
		assert.Equal(t, lvmpb.LogicalVolume_Attributes_THIN, resp.GetVolumes()[0].GetAttributes().GetType())
		assert.Equal(t, []string{""}, resp.GetVolumes()[0].GetTags(), "the daemon splits an empty lv_tags")
	})
	t.Run("volume groups", func(t *testing.T) {
		resp, err := c.ListVG(ctx, &lvmpb.ListVGRequest{})
		require.NoError(t, err)
		got := map[string][2]uint64{}
		for _, vg := range resp.GetVolumeGroups() {
			got[vg.GetName()] = [2]uint64{vg.GetSize(), vg.GetFreeSize()}
		}
		assert.Equal(t, map[string][2]uint64{
			"vg1": {64 * mib, 52 * mib}, "small": {8 * mib, 8 * mib}, "thin": {64 * mib, 120 * mib},
		}, got)
	})
	t.Run("remove", func(t *testing.T) {
		out, err := c.RemoveLV(ctx, &lvmpb.RemoveLVRequest{VolumeGroup: "vg1", Name: "a"})
		require.NoError(t, err)
		assert.Contains(t, out.GetCommandOutput(), "successfully removed")
		_, err = c.ListLV(ctx, &lvmpb.ListLVRequest{VolumeGroup: "vg1/a"})
		require.Error(t, err)
	})
}

func TestGoogleNoVolumeGroups(t *testing.T) {
	c, _ := startGoogle(t, lvmdfake.NewGoogle(lvmdfake.NewLVM()))
	_, err := c.ListVG(context.Background(), &lvmpb.ListVGRequest{})
	assert.Equal(t, "failed to list LVs: expected 5 components, got 1", status.Convert(err).Message())
}

func TestGoogleStopAndRestart(t *testing.T) {
	ctx := context.Background()
	g := lvmdfake.NewGoogle(newModel())
	c, addr := startGoogle(t, g)
	_, err := c.ListVG(ctx, &lvmpb.ListVGRequest{})
	require.NoError(t, err)

	g.Stop()
	_, err = c.ListVG(ctx, &lvmpb.ListVGRequest{})
	assert.Equal(t, codes.Unavailable, status.Code(err))

	again, err := g.Serve(addr)
	require.NoError(t, err)
	assert.Equal(t, addr, again)
	require.Eventually(t, func() bool {
		_, err := c.ListVG(ctx, &lvmpb.ListVGRequest{})
		return err == nil
	}, 3*time.Second, 10*time.Millisecond)
}
