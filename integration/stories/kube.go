package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// busybox is the guest's image for the stories' Pods (scripts/vm/images.sh:
// imported on the node, never pulled). Its applets beyond the few it links
// are run as /bin/busybox APPLET.
const busybox = "localhost/lvm-agent/busybox:guest"

// Within waits, polling each second until s.Wait has passed, for cond to be
// done. cond says what it saw (the failure names the last), and returns an
// error to end the story at once (a Pod that failed).
func (s *Story) Within(ctx context.Context, what string, cond func(context.Context) (done bool, seen string, err error)) {
	seen, fatal := "nothing yet", error(nil)
	err := wait.PollUntilContextTimeout(ctx, time.Second, s.Wait, true, func(ctx context.Context) (bool, error) {
		done, now, err := cond(ctx)
		seen, fatal = now, err
		return done, err
	})
	if fatal != nil {
		s.Fatalf("waiting for %s: %v", what, fatal)
	}
	if err != nil {
		s.Fatalf("no %s within %s (last seen: %s)", what, s.Wait, seen)
	}
}

// BlockPVC creates a volumeMode: Block claim of size in class; source, when
// not "", names the claim it clones. Its cleanup deletes it and waits until
// its PV and its LV are gone.
func (s *Story) BlockPVC(ctx context.Context, name, class, size, source string) {
	block := corev1.PersistentVolumeBlock
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.NS, Labels: map[string]string{"app": "lvm-stories"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class,
			VolumeMode:       &block,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			},
		},
	}
	what := fmt.Sprintf("a Block PVC of %s in %s", size, class)
	if source != "" {
		pvc.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: source}
		what += ", dataSource: PersistentVolumeClaim " + source
	}
	_, err := s.Kube.CoreV1().PersistentVolumeClaims(s.NS).Create(ctx, pvc, metav1.CreateOptions{})
	s.Must(err, "creating pvc/%s", name)
	s.Cleanup(func(ctx context.Context) { s.DeletePVC(ctx, name) })
	s.Show(fmt.Sprintf("kubectl apply -f %s.yaml   # %s", name, what), "persistentvolumeclaim/"+name+" created")
}

// Pod creates a busybox Pod that runs script once (restartPolicy Never)
// with claim's device as /dev/xvda. Its cleanup deletes it.
func (s *Story) Pod(ctx context.Context, name, claim, script string) {
	grace := int64(1) // busybox's sh as PID 1 ignores SIGTERM
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.NS, Labels: map[string]string{"app": "lvm-stories"}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "sh", Image: busybox, ImagePullPolicy: corev1.PullNever,
				Command:       []string{"sh", "-c", script},
				VolumeDevices: []corev1.VolumeDevice{{Name: "data", DevicePath: "/dev/xvda"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}
	_, err := s.Kube.CoreV1().Pods(s.NS).Create(ctx, pod, metav1.CreateOptions{})
	s.Must(err, "creating pod/%s", name)
	s.Cleanup(func(ctx context.Context) { s.DeletePod(ctx, name) })
	s.Show(fmt.Sprintf("kubectl apply -f %s-pod.yaml   # busybox, claim %s as /dev/xvda, running sh -c:", name, claim),
		"    "+script+"\npod/"+name+" created")
}

// PodOutput waits until the Pod has run its script to the end and returns
// what it printed. A Pod that failed ends the story, with its output.
func (s *Story) PodOutput(ctx context.Context, name string) string {
	pods := s.Kube.CoreV1().Pods(s.NS)
	s.Within(ctx, "pod/"+name+" Succeeded", func(ctx context.Context) (bool, string, error) {
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		seen := "phase " + string(pod.Status.Phase)
		for _, c := range pod.Status.ContainerStatuses {
			if w := c.State.Waiting; w != nil {
				seen += ", " + w.Reason + " " + w.Message
			}
		}
		switch pod.Status.Phase {
		case corev1.PodSucceeded:
			return true, seen, nil
		case corev1.PodFailed:
			logs, _ := pods.GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
			return false, seen, fmt.Errorf("pod/%s failed: %s; its output: %s", name, seen, logs)
		}
		return false, seen, nil
	})
	logs, err := pods.GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	s.Must(err, "reading pod/%s's output", name)
	s.Show("kubectl logs "+name, string(logs))
	return string(logs)
}

// DeletePod deletes the Pod and waits until it is gone.
func (s *Story) DeletePod(ctx context.Context, name string) {
	pods := s.Kube.CoreV1().Pods(s.NS)
	err := pods.Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	s.Must(err, "deleting pod/%s", name)
	s.Within(ctx, "pod/"+name+" gone", func(ctx context.Context) (bool, string, error) {
		return gone(pods.Get(ctx, name, metav1.GetOptions{}))
	})
	s.Show("kubectl delete pod "+name+" --wait", fmt.Sprintf("pod %q deleted", name))
}

// Volume is a bound claim as the node has it: its PV and its LV.
type Volume struct {
	Claim, UID, PV string
	Device         string // the PV's spec.local.path
	LV             LV     // the LV tagged with the claim's UID
}

// Bound reads the claim, its PV and its LV; each must be there.
func (s *Story) Bound(ctx context.Context, claim string) Volume {
	pvc, err := s.Kube.CoreV1().PersistentVolumeClaims(s.NS).Get(ctx, claim, metav1.GetOptions{})
	s.Must(err, "reading pvc/%s", claim)
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
		s.Fatalf("pvc/%s is %s, volumeName %q: not Bound", claim, pvc.Status.Phase, pvc.Spec.VolumeName)
	}
	pv, err := s.Kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	s.Must(err, "reading pv/%s of pvc/%s", pvc.Spec.VolumeName, claim)
	if pv.Spec.Local == nil || pv.Spec.Local.Path == "" {
		s.Fatalf("pv/%s of pvc/%s has no spec.local.path", pv.Name, claim)
	}
	v := Volume{Claim: claim, UID: string(pvc.UID), PV: pv.Name, Device: pv.Spec.Local.Path}
	s.Show(fmt.Sprintf("kubectl get pvc %s -o jsonpath='{.spec.volumeName}'", claim), v.PV)
	s.Show(fmt.Sprintf("kubectl get pv %s -o jsonpath='{.spec.local.path}'", v.PV), v.Device)
	lvs := s.LVs(ctx)
	owned := lvs.Owned(v.UID)
	if len(owned) != 1 {
		s.Fatalf("pvc/%s (uid %s): %d LVs of %s carry its tag %s%s, want 1", claim, v.UID, len(owned), s.VG, ownerTag, v.UID)
	}
	v.LV = owned[0]
	s.ShowLVs(lvs)
	return v
}

// DeletePVC deletes the claim and waits until it, its PV and its LV are gone.
func (s *Story) DeletePVC(ctx context.Context, name string) {
	pvcs := s.Kube.CoreV1().PersistentVolumeClaims(s.NS)
	pvc, err := pvcs.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	s.Must(err, "reading pvc/%s", name)
	s.Must(pvcs.Delete(ctx, name, metav1.DeleteOptions{}), "deleting pvc/%s", name)
	s.Within(ctx, "pvc/"+name+" gone", func(ctx context.Context) (bool, string, error) {
		return gone(pvcs.Get(ctx, name, metav1.GetOptions{}))
	})
	s.Show("kubectl delete pvc "+name+" --wait", fmt.Sprintf("persistentvolumeclaim %q deleted", name))
	if pv := pvc.Spec.VolumeName; pv != "" {
		s.Within(ctx, "pv/"+pv+" (of pvc/"+name+") gone", func(ctx context.Context) (bool, string, error) {
			return gone(s.Kube.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{}))
		})
		s.Show("kubectl wait --for=delete pv/"+pv, "persistentvolume/"+pv+" condition met")
	}
	s.Within(ctx, "no LV tagged "+ownerTag+string(pvc.UID)+" (pvc/"+name+")", func(ctx context.Context) (bool, string, error) {
		lvs, err := s.lvs(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		owned := lvs.Owned(string(pvc.UID))
		if len(owned) > 0 {
			return false, "LV " + owned[0].Name, nil
		}
		return true, "", nil
	})
}

// gone is a Get's answer as a wait's condition: done when NotFound.
func gone[T any](obj T, err error) (bool, string, error) {
	switch {
	case apierrors.IsNotFound(err):
		return true, "", nil
	case err != nil:
		return false, err.Error(), nil
	}
	var seen strings.Builder
	if o, ok := any(obj).(metav1.Object); ok {
		fmt.Fprintf(&seen, "still there")
		if t := o.GetDeletionTimestamp(); t != nil {
			fmt.Fprintf(&seen, ", deleting since %s, finalizers %v", t.Format(time.RFC3339), o.GetFinalizers())
		}
	}
	return false, seen.String(), nil
}
