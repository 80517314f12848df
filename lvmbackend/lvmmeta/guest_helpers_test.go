//go:build guest

package lvmmeta_test

// Loop devices, volume groups and lvm's own reports for the guest tests.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// run runs a tool and returns its stdout; a failure fails the test.
func run(tb testing.TB, name string, args ...string) string {
	tb.Helper()
	cmd := exec.Command(name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(tb, err, "%s %s: %s", name, strings.Join(args, " "), stderr.String())
	return string(out)
}

func lvm(tb testing.TB, args ...string) string {
	tb.Helper()
	return run(tb, "lvm", args...)
}

// loopDevice attaches a sparse file of size bytes (busybox's losetup has
// no --show: find a free device, then attach).
func loopDevice(tb testing.TB, size int64) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "pv.img")
	f, err := os.Create(path)
	require.NoError(tb, err)
	require.NoError(tb, f.Truncate(size))
	require.NoError(tb, f.Close())
	dev := strings.TrimSpace(run(tb, "losetup", "-f"))
	run(tb, "losetup", dev, path)
	tb.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	return dev
}

// newVG makes VG name on n loop devices of size bytes each, pvcreate
// taking pvArgs, and returns the devices.
func newVG(tb testing.TB, name string, n int, size int64, pvArgs ...string) []string {
	tb.Helper()
	var devs []string
	for range n {
		dev := loopDevice(tb, size)
		lvm(tb, append([]string{"pvcreate", "-y"}, append(pvArgs, dev)...)...)
		devs = append(devs, dev)
	}
	lvm(tb, append([]string{"vgcreate", "-y", name}, devs...)...)
	tb.Cleanup(func() {
		if out, err := exec.Command("lvm", "vgremove", "-ff", name).CombinedOutput(); err != nil {
			tb.Logf("cleanup: lvm vgremove %s: %v: %s", name, err, out)
		}
	})
	return devs
}

// lvsRow is one LV of `lvs -a --reportformat json`.
type lvsRow struct {
	Name       string `json:"lv_name"`
	UUID       string `json:"lv_uuid"`
	Size       string `json:"lv_size"`
	OriginSize string `json:"origin_size"`
	Tags       string `json:"lv_tags"`
	Attr       string `json:"lv_attr"`
	Origin     string `json:"origin"`
	Pool       string `json:"pool_lv"`
	Major      string `json:"lv_kernel_major"`
	Minor      string `json:"lv_kernel_minor"`
	Segtype    string `json:"segtype"`
}

// lvsReport is lvm's view of a VG, the ground truth: its seqno, extents and
// every LV (hidden ones without their brackets).
type lvsReport struct {
	Seqno, Extents, FreeExtents uint64
	LVs                         map[string]lvsRow
}

func report(tb testing.TB, vg string) lvsReport {
	tb.Helper()
	var lvs struct {
		Report []struct {
			LV []lvsRow `json:"lv"`
		} `json:"report"`
	}
	out := lvm(tb, "lvs", "-a", "--reportformat", "json", "--units", "b", "--nosuffix", "-o",
		"lv_name,lv_uuid,lv_size,origin_size,lv_tags,lv_attr,origin,pool_lv,lv_kernel_major,lv_kernel_minor,segtype", vg)
	require.NoError(tb, json.Unmarshal([]byte(out), &lvs), out)
	r := lvsReport{LVs: map[string]lvsRow{}}
	for _, rep := range lvs.Report {
		for _, row := range rep.LV {
			row.Name = strings.Trim(row.Name, "[]")
			row.Origin = strings.Trim(row.Origin, "[]")
			row.Pool = strings.Trim(row.Pool, "[]")
			if _, dup := r.LVs[row.Name]; !dup {
				r.LVs[row.Name] = row
			}
		}
	}
	var vgs struct {
		Report []struct {
			VG []struct {
				Seqno string `json:"vg_seqno"`
				Count string `json:"vg_extent_count"`
				Free  string `json:"vg_free_count"`
			} `json:"vg"`
		} `json:"report"`
	}
	out = lvm(tb, "vgs", "--reportformat", "json", "-o", "vg_seqno,vg_extent_count,vg_free_count", vg)
	require.NoError(tb, json.Unmarshal([]byte(out), &vgs), out)
	require.Len(tb, vgs.Report, 1)
	require.Len(tb, vgs.Report[0].VG, 1)
	v := vgs.Report[0].VG[0]
	r.Seqno, r.Extents, r.FreeExtents = atou(tb, v.Seqno), atou(tb, v.Count), atou(tb, v.Free)
	return r
}

func atou(tb testing.TB, s string) uint64 {
	tb.Helper()
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	require.NoError(tb, err, "number %q", s)
	return n
}

// splitTags splits lvs's comma-separated lv_tags ("" is none).
func splitTags(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// startLVMD runs topolvm's lvmd on vg (device class "bench") with an lvm wrapper that appends each
// command line to the returned log.
func startLVMD(t *testing.T, vg string) (lvmbackend.Backend, string) {
	bin := os.Getenv("LVMD_BIN")
	if bin == "" {
		bin = "/opt/lvm-agent/lvmd"
	}
	lvmPath, err := exec.LookPath("lvm")
	require.NoError(t, err)
	dir := t.TempDir()
	execLog := filepath.Join(dir, "lvm-exec.log")
	wrapper := filepath.Join(dir, "lvm")
	require.NoError(t, os.WriteFile(wrapper, []byte("#!/bin/sh\necho \"$*\" >>"+execLog+"\nexec "+lvmPath+" \"$@\"\n"), 0o755))
	socket := filepath.Join(dir, "lvmd.sock")
	config := filepath.Join(dir, "lvmd.yaml")
	require.NoError(t, os.WriteFile(config, []byte(fmt.Sprintf(`socket-name: %s
lvm-command-prefix: [%q]
device-classes:
  - name: bench
    volume-group: %s
    default: true
    spare-gb: 0
`, socket, wrapper, vg)), 0o600))
	cmd := exec.Command(bin, "--config", config, "--metrics-bind-address=")
	logFile, err := os.Create(filepath.Join(dir, "lvmd.log"))
	require.NoError(t, err)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	b, err := lvmbackend.NewTopolvm(socket)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	require.Eventually(t, func() bool {
		_, err := os.Stat(socket)
		return err == nil
	}, 5*time.Minute, 100*time.Millisecond, "lvmd's socket")
	return b, execLog
}

func lvName(i int) string { return fmt.Sprintf("lv%04d", i) }
