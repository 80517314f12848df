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
	s.WithinFor(ctx, s.Wait, what, cond)
}

// WithinFor is Within with a deadline of its own.
func (s *Story) WithinFor(ctx context.Context, deadline time.Duration, what string, cond func(context.Context) (done bool, seen string, err error)) {
	seen, fatal := "nothing yet", error(nil)
	err := wait.PollUntilContextTimeout(ctx, time.Second, deadline, true, func(ctx context.Context) (bool, error) {
		done, now, err := cond(ctx)
		seen, fatal = now, err
		return done, err
	})
	if fatal != nil {
		s.Fatalf("waiting for %s: %v", what, fatal)
	}
	if err != nil {
		s.Fatalf("no %s within %s (last seen: %s)", what, deadline, seen)
	}
}

// Claim is a PVC a story makes.
type Claim struct {
	Name, Class, Size string
	Block             bool   // volumeMode: Block (else Filesystem)
	Source            string // a claim it clones, or ""
	App               string // its app label (default lvm-stories)
}

// BlockPVC creates a volumeMode: Block claim of size in class; source, when
// not "", names the claim it clones.
func (s *Story) BlockPVC(ctx context.Context, name, class, size, source string) {
	s.PVC(ctx, Claim{Name: name, Class: class, Size: size, Block: true, Source: source})
}

// PVC creates the claim. Its cleanup deletes it and waits until its PV and
// its LV are gone.
func (s *Story) PVC(ctx context.Context, c Claim) {
	s.Must(s.createPVC(ctx, c), "creating pvc/%s", c.Name)
	s.Cleanup(func(ctx context.Context) { s.DeletePVC(ctx, c.Name) })
	what := fmt.Sprintf("%s PVC of %s in %s", map[bool]string{true: "a Block", false: "a Filesystem"}[c.Block], c.Size, c.Class)
	if c.Source != "" {
		what += ", dataSource: PersistentVolumeClaim " + c.Source
	}
	s.Show(fmt.Sprintf("kubectl apply -f %s.yaml   # %s", c.Name, what), "persistentvolumeclaim/"+c.Name+" created")
}

func (s *Story) createPVC(ctx context.Context, c Claim) error {
	mode := corev1.PersistentVolumeFilesystem
	if c.Block {
		mode = corev1.PersistentVolumeBlock
	}
	if c.App == "" {
		c.App = "lvm-stories"
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: s.NS, Labels: map[string]string{"app": c.App}},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &c.Class,
			VolumeMode:       &mode,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(c.Size)},
			},
		},
	}
	if c.Source != "" {
		pvc.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: c.Source}
	}
	_, err := s.Kube.CoreV1().PersistentVolumeClaims(s.NS).Create(ctx, pvc, metav1.CreateOptions{})
	return err
}

// Pod creates a busybox Pod that runs script once (restartPolicy Never)
// with claim's device as /dev/xvda. Its cleanup deletes it.
func (s *Story) Pod(ctx context.Context, name, claim, script string) {
	s.Must(s.createPod(ctx, PodSpec{Name: name, Claim: claim, Block: true, Script: script, Once: true}), "creating pod/%s", name)
	s.Cleanup(func(ctx context.Context) { s.DeletePod(ctx, name) })
	s.Show(fmt.Sprintf("kubectl apply -f %s-pod.yaml   # busybox, claim %s as /dev/xvda, running sh -c:", name, claim),
		"    "+script+"\npod/"+name+" created")
}

// PodSpec is a busybox Pod a story makes: its claim at /data (Block: as
// /dev/xvda; no claim: an emptyDir at /data).
type PodSpec struct {
	Name, Claim string
	Block       bool
	Script      string
	Once        bool   // run the script, then end (else run it, then stay up until deleted)
	App         string // its app label (default lvm-stories)
}

// RunPod creates a Pod that runs its script, then stays up until deleted.
// Its cleanup deletes it.
func (s *Story) RunPod(ctx context.Context, p PodSpec) {
	s.Must(s.createPod(ctx, p), "creating pod/%s", p.Name)
	s.Cleanup(func(ctx context.Context) { s.DeletePod(ctx, p.Name) })
	where := "claim " + p.Claim + " at /data"
	switch {
	case p.Claim == "":
		where = "an emptyDir at /data"
	case p.Block:
		where = "claim " + p.Claim + " as /dev/xvda"
	}
	s.Show(fmt.Sprintf("kubectl apply -f %s-pod.yaml   # busybox, %s, running sh -c:", p.Name, where),
		"    "+p.Script+"\npod/"+p.Name+" created")
}

func (s *Story) createPod(ctx context.Context, p PodSpec) error {
	grace := int64(1) // busybox's sh as PID 1 ignores SIGTERM
	if p.App == "" {
		p.App = "lvm-stories"
	}
	c := corev1.Container{Name: "sh", Image: busybox, ImagePullPolicy: corev1.PullNever,
		Command: []string{"sh", "-c", p.Script}}
	restart := corev1.RestartPolicyNever
	if !p.Once {
		restart = corev1.RestartPolicyAlways
		c.Command[2] = "trap 'exit 0' TERM; " + p.Script + "; sleep 3600 & wait"
	}
	vol := corev1.Volume{Name: "data"}
	switch {
	case p.Claim == "":
		vol.EmptyDir = &corev1.EmptyDirVolumeSource{}
		c.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	case p.Block:
		vol.PersistentVolumeClaim = &corev1.PersistentVolumeClaimVolumeSource{ClaimName: p.Claim}
		c.VolumeDevices = []corev1.VolumeDevice{{Name: "data", DevicePath: "/dev/xvda"}}
	default:
		vol.PersistentVolumeClaim = &corev1.PersistentVolumeClaimVolumeSource{ClaimName: p.Claim}
		c.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: s.NS, Labels: map[string]string{"app": p.App}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 restart,
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []corev1.Container{c},
			Volumes:                       []corev1.Volume{vol},
		},
	}
	_, err := s.Kube.CoreV1().Pods(s.NS).Create(ctx, pod, metav1.CreateOptions{})
	return err
}

// WaitReady waits until each Pod is Ready; a Pod that failed ends the story.
func (s *Story) WaitReady(ctx context.Context, names ...string) {
	for _, name := range names {
		s.Within(ctx, "pod/"+name+" Ready", func(ctx context.Context) (bool, string, error) {
			pod, err := s.Kube.CoreV1().Pods(s.NS).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			return podReady(pod)
		})
	}
	s.Show("kubectl wait --for=condition=Ready pod/"+strings.Join(names, " pod/"),
		"pod/"+strings.Join(names, " condition met\npod/")+" condition met")
}

// podReady is a Pod's state as a wait's condition: done when Ready, an
// error when it failed.
func podReady(pod *corev1.Pod) (bool, string, error) {
	seen := "phase " + string(pod.Status.Phase)
	for _, c := range pod.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil {
			seen += ", " + w.Reason + " " + w.Message
		}
	}
	if pod.Status.Phase == corev1.PodFailed {
		return false, seen, fmt.Errorf("pod/%s failed: %s", pod.Name, seen)
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true, seen, nil
		}
	}
	return false, seen, nil
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
