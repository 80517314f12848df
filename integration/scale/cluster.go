package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
)

const (
	benchNode       = "bench-node"
	foreignNS       = 20  // namespaces the foreign PVCs are spread over
	foreignNodes    = 500 // other nodes the foreign objects belong to
	annChurn        = "bench.lvm-agent.io/churn"
	storageClass    = "csi-local-lvm"
	provisionerName = kube.DefaultDriver
)

// cluster is the control plane with its foreign objects.
type cluster struct {
	cp     *harness.ControlPlane
	c      kubernetes.Interface // the bench's client: protobuf, no rate limit to speak of
	cfg    config
	logf   func(string, ...any)
	have   int // foreign PVCs (and PVs) made so far
	churn  context.CancelFunc
	wg     sync.WaitGroup
	writes atomic.Int64
	lab    *labeller // the hybrid rows' labeller, while one runs
}

func newCluster(ctx context.Context, cp *harness.ControlPlane, cfg config, logf func(string, ...any)) (*cluster, error) {
	rc := *cp.Config
	rc.QPS, rc.Burst = 5000, 10000
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	c, err := kubernetes.NewForConfig(&rc)
	if err != nil {
		return nil, err
	}
	cl := &cluster{cp: cp, c: c, cfg: cfg, logf: logf}
	for i := 0; i < foreignNS; i++ {
		if err := cl.namespace(ctx, fmt.Sprintf("foreign-%02d", i)); err != nil {
			return nil, err
		}
	}
	if err := cl.namespace(ctx, burstNS); err != nil {
		return nil, err
	}
	// The bench node exists, as it would in a cluster (the agent reports capacity on it).
	_, err = c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: benchNode}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	return cl, nil
}

func (cl *cluster) namespace(ctx context.Context, name string) error {
	_, err := cl.c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// grow makes foreign PVCs and PVs until there are n of each.
func (cl *cluster) grow(ctx context.Context, n int) error {
	if n <= cl.have {
		return nil
	}
	start := time.Now()
	err := parallel(ctx, cl.cfg.createWorkers, cl.have, n, func(ctx context.Context, i int) error {
		pvc := foreignPVC(i, cl.cfg.unlabelledFrac)
		if _, err := cl.c.CoreV1().PersistentVolumeClaims(pvc.Namespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		pv := foreignPV(i, pvc, cl.cfg.unlabelledFrac)
		if _, err := cl.c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	cl.logf("made foreign PVCs and PVs %d..%d in %v (%.0f objects/s)", cl.have, n, time.Since(start).Round(time.Millisecond),
		float64(2*(n-cl.have))/time.Since(start).Seconds())
	cl.have = n
	return nil
}

// A foreign object belongs to one of many other nodes. Most are labelled as
// lvm-agent's provisioner helpers label them; some are not (a provisioner
// written for the original agent, or a volume of another driver). One in ten
// PVCs has an open create request, one in ten PVs an open delete request,
// for their own nodes' agents (which do not run here).
func foreignPVC(i int, unlabelledFrac float64) *corev1.PersistentVolumeClaim {
	node := fmt.Sprintf("node-%03d", i%foreignNodes)
	name := fmt.Sprintf("data-%06d", i)
	pvc := harness.NewPVC(fmt.Sprintf("foreign-%02d", i%foreignNS), name, node)
	pvc.Annotations["volume.beta.kubernetes.io/storage-provisioner"] = provisionerName
	pvc.Annotations["volume.kubernetes.io/storage-provisioner"] = provisionerName
	pvc.Annotations["pv.kubernetes.io/bind-completed"] = "yes"
	pvc.Annotations[kube.AnnSpec] = fmt.Sprintf(`{"volumeGroup":"vg1","name":"pvc-%06d","size":1073741824}`, i)
	switch i % 10 {
	case 0:
		pvc.Annotations[kube.AnnLifecycle] = kube.StateCreating
	case 1:
	default:
		pvc.Annotations[kube.AnnLifecycle] = kube.StateCreated
	}
	if !unlabelled(i, unlabelledFrac) {
		pvc.Labels = map[string]string{kube.LabelNode: kube.NodeLabelValue(node)}
	}
	pvc.Labels = merge(pvc.Labels, map[string]string{"app": "db", "release": strconv.Itoa(i % 50)})
	sc := storageClass
	pvc.Spec.StorageClassName = &sc
	pvc.Spec.VolumeName = fmt.Sprintf("pv-%06d", i)
	return pvc
}

func foreignPV(i int, claim *corev1.PersistentVolumeClaim, unlabelledFrac float64) *corev1.PersistentVolume {
	node := claim.Annotations[kube.AnnSelectedNode]
	claim = claim.DeepCopy()
	claim.UID = types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", i))
	pv := harness.NewPV(fmt.Sprintf("pv-%06d", i), node, kube.DefaultDriver, claim, fmt.Sprintf("vg1/pvc-%06d", i))
	pv.Spec.StorageClassName = storageClass
	pv.Spec.CSI.FSType = "ext4"
	pv.Spec.CSI.VolumeAttributes = map[string]string{"volumeType": "LVM", "vgName": "vg1", "storage.kubernetes.io/csiProvisionerIdentity": "1700000000000-8081-" + kube.DefaultDriver}
	pv.Annotations["pv.kubernetes.io/provisioned-by"] = provisionerName
	if i%10 == 0 {
		pv.Annotations[kube.AnnLifecycle] = kube.StateDeleting
	}
	if !unlabelled(i, unlabelledFrac) {
		pv.Labels = map[string]string{kube.LabelNode: kube.NodeLabelValue(node)}
	}
	return pv
}

// unlabelled spreads the unlabelled objects evenly over the indexes.
func unlabelled(i int, frac float64) bool {
	return int(float64(i+1)*frac) != int(float64(i)*frac)
}

func merge(a, b map[string]string) map[string]string {
	if a == nil {
		a = map[string]string{}
	}
	for k, v := range b {
		a[k] = v
	}
	return a
}

// startChurn writes to random foreign objects at the configured rate, as
// the rest of a cluster does, until stopChurn.
func (cl *cluster) startChurn(ctx context.Context) {
	if cl.have == 0 || cl.cfg.churn <= 0 {
		return
	}
	ctx, cl.churn = context.WithCancel(ctx)
	cl.wg.Add(1)
	go func() {
		defer cl.wg.Done()
		tick := time.NewTicker(time.Duration(float64(time.Second) / cl.cfg.churn))
		defer tick.Stop()
		sem := make(chan struct{}, 8)
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			select {
			case sem <- struct{}{}:
			default:
				continue // the API server is behind: skip rather than pile up
			}
			i := rand.IntN(cl.have)
			patch := []byte(`{"metadata":{"annotations":{"` + annChurn + `":"` + strconv.Itoa(n) + `"}}}`)
			go func() {
				defer func() { <-sem }()
				var err error
				if n%2 == 0 {
					_, err = cl.c.CoreV1().PersistentVolumeClaims(fmt.Sprintf("foreign-%02d", i%foreignNS)).Patch(ctx,
						fmt.Sprintf("data-%06d", i), types.MergePatchType, patch, metav1.PatchOptions{})
				} else {
					_, err = cl.c.CoreV1().PersistentVolumes().Patch(ctx, fmt.Sprintf("pv-%06d", i), types.MergePatchType, patch, metav1.PatchOptions{})
				}
				if err == nil {
					cl.writes.Add(1)
				}
			}()
		}
	}()
}

func (cl *cluster) stopChurn() {
	if cl.churn != nil {
		cl.churn()
		cl.wg.Wait()
		cl.churn = nil
	}
}

// parallel runs fn for every i in [from, to) on workers goroutines; the
// first error stops it.
func parallel(ctx context.Context, workers, from, to int, fn func(context.Context, int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ch := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ch {
				if err := fn(ctx, i); err != nil {
					cancel(err)
				}
			}
		}()
	}
	for i := from; i < to && ctx.Err() == nil; i++ {
		select {
		case ch <- i:
		case <-ctx.Done():
		}
	}
	close(ch)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && ctx.Err() != nil {
		return err
	}
	return nil
}

// removeFinalizers lets a lone API server (no controllers) delete the object.
var removeFinalizers = []byte(`{"metadata":{"finalizers":null}}`)

// deletePVCs removes PVCs, finalizers first.
func (cl *cluster) deletePVCs(ctx context.Context, ns string, names []string) error {
	return parallel(ctx, cl.cfg.createWorkers, 0, len(names), func(ctx context.Context, i int) error {
		_, err := cl.c.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, names[i], types.MergePatchType, removeFinalizers, metav1.PatchOptions{})
		if err == nil {
			err = cl.c.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, names[i], metav1.DeleteOptions{})
		}
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
}
