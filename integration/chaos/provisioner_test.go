package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

// provisioner plays a CSI controller and a user: it makes claims, asks the
// agent for volumes through the provisioner helpers, binds PVs, deletes
// claims and asks for the volumes' deletion. Its API calls survive API
// server restarts by retrying, as a controller's work queue would; it never
// writes a request again once it was written (a second "creating" after an
// answer would be a new request, and a write after the final state).
type provisioner struct {
	c       kubernetes.Interface
	node    string
	tracker *tracker
	// deadline bounds each volume's whole life.
	deadline time.Duration
}

// run carries out v's plan; v.err is set when it could not.
func (p *provisioner) run(ctx context.Context, v *volume) {
	if v.kind == kindPointer {
		// Its life starts once the live volume's LV exists (before, its
		// delete is rightly "deleted": there is no LV). That volume may be of
		// a later wave: waiting for it is not the pointer's own time (seed
		// 1655820604 on a loaded host: 4 min passed before it was created).
		if _, err := p.tracker.waitFinal(ctx, objKey{"pvc", v.victim.ns, v.victim.pvc}, ""); err != nil {
			v.err = err
			return
		}
	}
	ctx, cancel := context.WithTimeout(ctx, p.deadline)
	defer cancel()
	if err := p.lifecycle(ctx, v); err != nil {
		v.err = err
	}
}

func (p *provisioner) lifecycle(ctx context.Context, v *volume) error {
	switch v.kind {
	case kindProtected:
		// A PV, bound to the claim the protected LV names, and no claim.
		return p.remove(ctx, v, strings.TrimPrefix(v.target.tags[0], agent.OwnerTagPrefix))
	case kindLegacy:
		// The original agent's PV: its claim is long gone.
		return p.remove(ctx, v, fmt.Sprintf("legacy-claim-%d", v.i))
	case kindPointer: // once the live volume's LV exists (run)
		return p.remove(ctx, v, "")
	}
	pvc, err := p.makeClaim(ctx, v, "")
	if err != nil {
		return err
	}
	v.uid = pvc.UID
	switch v.kind {
	case kindTerminating:
		// Deleted first: the pvc-protection finalizer keeps it, terminating.
		if err := retry(ctx, func(ctx context.Context) error {
			err := p.c.CoreV1().PersistentVolumeClaims(v.ns).Delete(ctx, v.pvc, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &v.uid}})
			return err
		}); err != nil {
			return err
		}
		if err := p.writeRequest(ctx, v, v.createSpecJSON()); err != nil {
			return err
		}
		if _, err := p.tracker.waitFinal(ctx, objKey{"pvc", v.ns, v.pvc}, v.uid); err != nil {
			return err
		}
		v.released = time.Now()
		return p.deleteClaim(ctx, v)
	case kindRecreate:
		spec := v.createSpec()
		spec.Name = v.oldLV
		if err := p.createWith(ctx, v, spec, 1); err != nil {
			return err
		}
		r, err := p.tracker.waitFinal(ctx, objKey{"pvc", v.ns, v.pvc}, v.uid)
		if err != nil {
			return err
		}
		v.firstAnswered = r.answered
		sleep(ctx, v.dwell)
		v.first = time.Now()
		if err := p.deleteClaim(ctx, v); err != nil {
			return err
		}
		pvc, err := p.makeClaim(ctx, v, v.uid)
		if err != nil {
			return err
		}
		v.uid = pvc.UID
		return p.createWith(ctx, v, v.createSpec(), 1)
	case kindRetry:
		tooBig := v.createSpec()
		tooBig.Size = (thinOverprov + 1) * classSize // beyond a thin class's overprovisioning too
		if err := p.createWith(ctx, v, tooBig, 1); err != nil {
			return err
		}
		return p.createWith(ctx, v, v.again, 2)
	case kindRenamed, kindResized:
		if err := p.createWith(ctx, v, v.createSpec(), 1); err != nil {
			return err
		}
		sleep(ctx, v.dwell)
		return p.createWith(ctx, v, v.again, 2)
	case kindStealer:
		if err := p.createWith(ctx, v, v.createSpec(), 1); err != nil {
			return err
		}
		sleep(ctx, v.dwell)
		return p.remove(ctx, v, string(v.uid)) // the claim stays
	case kindMisdirected:
		if err := p.createWith(ctx, v, v.createSpec(), 1); err != nil {
			return err
		}
		sleep(ctx, v.dwell)
		return p.misdirect(ctx, v)
	}
	switch v.kind {
	case kindAbandon:
		if err := p.writeRequest(ctx, v, v.createSpecJSON()); err != nil {
			return err
		}
		sleep(ctx, v.dwell)
		v.released = time.Now()
		return p.deleteClaim(ctx, v)
	case kindInvalid:
		if err := p.writeRequest(ctx, v, v.spec); err != nil {
			return err
		}
		_, err := p.tracker.waitFinal(ctx, objKey{"pvc", v.ns, v.pvc}, v.uid)
		return err
	}
	if err := p.createWith(ctx, v, v.createSpec(), 1); err != nil {
		return err
	}
	if v.kind != kindFull {
		return nil
	}
	sleep(ctx, v.dwell)
	if err := p.remove(ctx, v, string(v.uid)); err != nil {
		return err
	}
	return nil
}

func (v *volume) createSpecJSON() string {
	return fmt.Sprintf(`{"volumeGroup":%q,"name":%q,"size":%d}`, v.class, v.lv, v.size)
}

// makeClaim creates the PVC with the scheduler's selected-node; not the
// claim of UID old (deleted, and perhaps not gone yet: it is waited for).
func (p *provisioner) makeClaim(ctx context.Context, v *volume, old types.UID) (*corev1.PersistentVolumeClaim, error) {
	var out *corev1.PersistentVolumeClaim
	err := retry(ctx, func(ctx context.Context) error {
		var err error
		out, err = p.c.CoreV1().PersistentVolumeClaims(v.ns).Create(ctx, harness.NewPVC(v.ns, v.pvc, p.node), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			// An earlier attempt was stored but its answer lost.
			out, err = p.c.CoreV1().PersistentVolumeClaims(v.ns).Get(ctx, v.pvc, metav1.GetOptions{})
		}
		if err == nil && old != "" && out.UID == old {
			return fmt.Errorf("claim %s/%s of UID %s not gone yet", v.ns, v.pvc, old)
		}
		return err
	})
	return out, err
}

// createWith asks for the volume with the helper, which watches for the
// answer: the round-th request on the claim. When the helper fails for a
// reason other than an answer (the API server went away), what happened is
// read back: a request not yet written is written again; one written is
// waited for.
func (p *provisioner) createWith(ctx context.Context, v *volume, spec kube.CreateSpec, round int) error {
	key := objKey{"pvc", v.ns, v.pvc}
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		state, asked, err := p.pvcRequest(ctx, v)
		if err != nil {
			return err
		}
		// Written already: any state on the first request; on a later one
		// "creating", or a final state of this very spec (specs of one
		// claim's requests differ).
		raw, _ := json.Marshal(spec)
		if round == 1 && state != "" || round > 1 && (state == kube.StateCreating || asked == string(raw)) {
			_, err := p.tracker.waitFinalN(ctx, key, v.uid, round)
			return err
		}
		hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = kube.CreateVolumeWithAnnotations(hctx, clientset.Wrap(p.c), v.ns, v.pvc, spec, nil)
		cancel()
		var failed *kube.FailedError
		if err == nil || errors.As(err, &failed) {
			return nil // an answer: the end checks judge it
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// remove binds a PV to the claim, deletes the claim (as a user would;
// there is no PVC protection controller here, so its finalizer is removed
// too), and asks for the volume's deletion with the helper.
func (p *provisioner) remove(ctx context.Context, v *volume, claimUID string) error {
	pv := harness.NewPV(v.pv, p.node, kube.DefaultDriver, nil, "")
	pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: v.ns, Name: v.pvc, UID: types.UID(claimUID)}
	if v.kind == kindPointer {
		pv.Spec.ClaimRef = v.ref
	}
	err := retry(ctx, func(ctx context.Context) error {
		_, err := p.c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
	if err != nil {
		return err
	}
	if v.kind == kindFull {
		if err := p.deleteClaim(ctx, v); err != nil {
			return err
		}
	}
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var state string
		err := retry(ctx, func(ctx context.Context) error {
			got, err := p.c.CoreV1().PersistentVolumes().Get(ctx, v.pv, metav1.GetOptions{})
			if err == nil {
				state = got.Annotations[kube.AnnLifecycle]
			}
			return err
		})
		if err != nil {
			return err
		}
		if state != "" {
			_, err := p.tracker.waitFinal(ctx, objKey{"pv", "", v.pv}, "")
			return err
		}
		if v.released.IsZero() {
			v.released = time.Now()
		}
		hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = kube.DeleteVolumeWithAnnotations(hctx, clientset.Wrap(p.c), v.pv, v.class, v.lv, nil)
		cancel()
		var failed *kube.FailedError
		if err == nil || errors.As(err, &failed) {
			return nil
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// misdirect makes kindMisdirected's PV: bound to the live claim, its node
// affinity naming another node, its volume.node label this one, created
// already asking for the deletion of the claim's LV.
func (p *provisioner) misdirect(ctx context.Context, v *volume) error {
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: v.ns, Name: v.pvc, UID: v.uid}}
	pv := harness.NewPV(v.pv, p.node+"-elsewhere", kube.DefaultDriver, claim, v.class+"/"+v.lv)
	pv.Labels = map[string]string{kube.LabelNode: kube.NodeLabelValue(p.node)}
	pv.Annotations[kube.AnnLifecycle] = kube.StateDeleting
	return retry(ctx, func(ctx context.Context) error {
		_, err := p.c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
}

// writeRequest writes "creating" with a spec as it is, which the helper
// (which takes a CreateSpec) cannot do for a hostile one.
func (p *provisioner) writeRequest(ctx context.Context, v *volume, spec string) error {
	return retry(ctx, func(ctx context.Context) error {
		_, err := kube.UpdatePvcWithAnnotations(ctx, clientset.Wrap(p.c), v.ns, v.pvc, "",
			kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreating, kube.AnnSpec: spec}),
			kube.Set(map[string]string{kube.LabelNode: kube.NodeLabelValue(p.node)}))
		return err
	})
}

// pvcRequest reads the claim's lifecycle state and spec.
func (p *provisioner) pvcRequest(ctx context.Context, v *volume) (state, spec string, err error) {
	err = retry(ctx, func(ctx context.Context) error {
		got, err := p.c.CoreV1().PersistentVolumeClaims(v.ns).Get(ctx, v.pvc, metav1.GetOptions{})
		if err == nil {
			state, spec = got.Annotations[kube.AnnLifecycle], got.Annotations[kube.AnnSpec]
		}
		return err
	})
	return state, spec, err
}

// deleteClaim deletes the PVC and drops its protection finalizer.
func (p *provisioner) deleteClaim(ctx context.Context, v *volume) error {
	return retry(ctx, func(ctx context.Context) error {
		err := p.c.CoreV1().PersistentVolumeClaims(v.ns).Delete(ctx, v.pvc, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &v.uid}})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		_, err = p.c.CoreV1().PersistentVolumeClaims(v.ns).Patch(ctx, v.pvc, types.MergePatchType,
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
}

// retry repeats fn until it succeeds or ctx ends: an API server restart
// makes calls fail for a while.
func retry(ctx context.Context, fn func(context.Context) error) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := fn(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		}
		sleep(ctx, 100*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
