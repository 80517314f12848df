package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The audit of the whole node after faults (make test-faults' counts):
// every live claim Bound with exactly one LV tagged with its UID, of at
// least its 16 MiB (lost, duplicated); no LV or PV of a claim that is gone
// (orphaned); no request left open or answered failed; an LV that is not
// lvm-agent's still there with its UUID, tags and bytes (foreign). Each
// count must be 0.

// thinPool is the thin pool setup-lvm.sh makes in the volume group: the
// operator's, never a claim's.
const thinPool = "pool0"

const lifecycle = "pv.csi.alibabacloud.com/volume.lifecycle"

// Audit is one row of counts.
type Audit struct{ Lost, Dup, Orphan, Open, Failed, Foreign int }

func (a Audit) String() string {
	return fmt.Sprintf("%d %d %d %d %d %d", a.Lost, a.Dup, a.Orphan, a.Open, a.Failed, a.Foreign)
}

// Zero: nothing found.
func (a Audit) Zero() bool { return a == Audit{} }

// Foreign is an LV that is not lvm-agent's, with 1 MiB of random bytes,
// and what it was when made.
type Foreign struct{ Name, Before string }

// MakeForeign makes it; its cleanup removes it.
func (s *Story) MakeForeign(ctx context.Context) *Foreign {
	f := &Foreign{Name: "foreign"}
	s.Lvm(ctx, "lvcreate", "-q", "-y", "-n", f.Name, "-L", "8M", "--addtag", "owner=someone-else", s.VG)
	s.Cleanup(func(ctx context.Context) {
		if _, ok := s.LVs(ctx).Named(f.Name); ok {
			s.Lvm(ctx, "lvremove", "-q", "-y", s.VG+"/"+f.Name)
		}
	})
	dev, err := os.OpenFile("/dev/"+s.VG+"/"+f.Name, os.O_WRONLY|os.O_SYNC, 0)
	s.Must(err, "opening LV %s", f.Name)
	_, err = io.CopyN(dev, rand.Reader, 1<<20)
	if cerr := dev.Close(); err == nil {
		err = cerr
	}
	s.Must(err, "writing 1 MiB of random bytes to LV %s", f.Name)
	f.Before = s.foreignState(ctx, f)
	return f
}

// foreignState: its UUID and tags, and a digest of its first MiB.
func (s *Story) foreignState(ctx context.Context, f *Foreign) string {
	out, err := exec.CommandContext(ctx, "lvm", "lvs", "--noheadings", "-o", "lv_uuid,lv_tags", s.VG+"/"+f.Name).CombinedOutput()
	state := strings.Join(strings.Fields(string(out)), " ")
	if err != nil {
		return state + " " + err.Error()
	}
	dev, err := os.Open("/dev/" + s.VG + "/" + f.Name)
	if err != nil {
		return state + " " + err.Error()
	}
	defer dev.Close()
	h := sha256.New()
	if _, err := io.CopyN(h, dev, 1<<20); err != nil {
		return state + " " + err.Error()
	}
	return fmt.Sprintf("%s %x", state, h.Sum(nil))
}

// Audit counts what is wrong on the node: the claims labelled app (live of
// them at least), every PV, every LV of the volume group but the pool and
// foreign. Each finding is printed.
func (s *Story) Audit(ctx context.Context, app string, live int, foreign *Foreign) Audit {
	var a Audit
	say := func(format string, args ...any) { fmt.Fprintf(s.out, "audit: "+format+"\n", args...) }
	pvcs, err := s.Kube.CoreV1().PersistentVolumeClaims(s.NS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	s.Must(err, "listing the claims app=%s", app)
	pvs, err := s.Kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	s.Must(err, "listing the PVs")
	lvs := s.LVs(ctx)
	if n := len(pvcs.Items); n < live {
		say("%d claims of %d", n, live)
		a.Lost += live - n
	}
	var uids []string
	for _, c := range pvcs.Items {
		uids = append(uids, string(c.UID))
		owned := lvs.Owned(string(c.UID))
		for _, lv := range owned {
			if lv.Size < 16<<20 {
				say("pvc/%s: its LV %s has %d bytes", c.Name, lv.Name, lv.Size)
				a.Lost++
			}
		}
		if c.Status.Phase != "Bound" {
			say("pvc/%s is %s", c.Name, c.Status.Phase)
			a.Lost++
		}
		switch n := len(owned); {
		case n == 0:
			say("pvc/%s: no LV", c.Name)
			a.Lost++
		case n > 1:
			say("pvc/%s: %d LVs", c.Name, n)
			a.Dup += n - 1
		}
		switch state := c.Annotations[lifecycle]; state {
		case "failed":
			say("pvc/%s answered failed", c.Name)
			a.Failed++
		case "created":
		default:
			say("pvc/%s: request %q", c.Name, state)
			a.Open++
		}
	}
	for _, lv := range lvs {
		if lv.Name == thinPool || foreign != nil && lv.Name == foreign.Name || slices.Contains(s.NodeLVs, lv.Name) {
			continue
		}
		if !slices.ContainsFunc(uids, func(uid string) bool { return slices.Contains(lv.Tags, ownerTag+uid) }) {
			say("LV %s/%s (tags %v) has no claim", s.VG, lv.Name, lv.Tags)
			a.Orphan++
		}
	}
	for _, pv := range pvs.Items {
		if pv.Spec.ClaimRef == nil || !slices.Contains(uids, string(pv.Spec.ClaimRef.UID)) {
			say("pv/%s (claim %v) has no claim", pv.Name, pv.Spec.ClaimRef)
			a.Orphan++
		}
		if pv.Annotations[lifecycle] == "failed" {
			say("pv/%s answered failed", pv.Name)
			a.Failed++
		}
	}
	if foreign != nil {
		if now := s.foreignState(ctx, foreign); now != foreign.Before {
			say("%s/%s changed: %s, was %s", s.VG, foreign.Name, now, foreign.Before)
			a.Foreign = 1
		}
	}
	fmt.Fprintf(s.out, "audit: %s (lost duplicated orphaned open failed foreign)\n", a)
	return a
}

// KillsTable prints make test-faults' figures: one row per fault.
func (s *Story) KillsTable(rows [][]string) {
	const format = "%-32s %7s %7s %9s %4s %4s %6s %4s %6s %7s\n"
	fmt.Fprintf(s.out, "\n"+format, "fault", "creates", "deletes", "recover s", "lost", "dup", "orphan", "open", "failed", "foreign")
	for _, r := range rows {
		args := make([]any, len(r))
		for i, v := range r {
			args[i] = v
		}
		fmt.Fprintf(s.out, format, args...)
	}
}

// The audit and the foreign LV as tools, for the power cut's shell
// (scripts/guest/powercut-cluster.sh), whose two boots share only the disk
// and the host's share: the foreign LV's state is kept in a file.
//
//	lvm-stories foreign -state FILE
//	lvm-stories audit -state FILE [-app faults] [-live N] [-node-lvs LV,...]
//
// audit's last line is the row, "audit: N N N N N N (lost duplicated
// orphaned open failed foreign)"; its exit code is 0 whatever it found
// (the caller judges the row), 1 when it could not look.
func init() {
	tools["foreign"] = func(args []string) int {
		fs := flag.NewFlagSet("foreign", flag.ContinueOnError)
		state := fs.String("state", "", "the file its state is written to, for the audit (required)")
		vg := fs.String("vg", "vg1", "its volume group")
		if fs.Parse(args) != nil || *state == "" {
			return 2
		}
		return tool("foreign", *vg, func(ctx context.Context, s *Story) {
			f := s.MakeForeign(ctx)
			s.Must(os.WriteFile(*state, []byte(f.Before), 0o644), "writing %s", *state)
		})
	}
	tools["audit"] = func(args []string) int {
		fs := flag.NewFlagSet("audit", flag.ContinueOnError)
		state := fs.String("state", "", "the foreign LV's state, as foreign wrote it (required)")
		app := fs.String("app", "faults", "the app label of the claims audited")
		live := fs.Int("live", 0, "how many of them must be there")
		nodeLVs := fs.String("node-lvs", "", "LVs of the node's own, comma-separated: left out")
		vg := fs.String("vg", "vg1", "the volume group")
		if fs.Parse(args) != nil || *state == "" {
			return 2
		}
		return tool("audit", *vg, func(ctx context.Context, s *Story) {
			before, err := os.ReadFile(*state)
			s.Must(err, "reading the foreign LV's state")
			if *nodeLVs != "" {
				s.NodeLVs = strings.Split(*nodeLVs, ",")
			}
			s.Audit(ctx, *app, *live, &Foreign{Name: "foreign", Before: string(before)})
		})
	}
}

// tool runs f as a story without steps or cleanups: 1 when it failed.
func tool(name, vg string, f func(context.Context, *Story)) int {
	cfg, kube, err := connect()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lvm-stories:", err)
		return 1
	}
	s := &Story{Name: name, Kube: kube, Config: cfg, NS: "default", VG: vg, Wait: 10 * time.Minute, out: os.Stdout, t0: time.Now()}
	if !s.try(func() { f(context.Background(), s) }) {
		return 1
	}
	return 0
}
