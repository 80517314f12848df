package kube

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

func TestParseGrowSpec(t *testing.T) {
	spec, err := ParseGrowSpec(` {"volumeGroup":"vg0","name":"pvc-1","size":268435455} `)
	require.NoError(t, err)
	assert.Equal(t, CreateSpec{VolumeGroup: "vg0", Name: "pvc-1", Size: 268435456}, spec, "rounded up to lvmd's unit")
	for _, bad := range []string{"", "vg0/pvc-1", `{"volumeGroup":"vg0","name":"pvc-1"}`,
		`{"volumeGroup":"vg0","name":"pvc-1","size":-1}`, `{"volumeGroup":"vg0","name":"pvc-1","size":1,"grow":true}`} {
		_, err := ParseGrowSpec(bad)
		assert.ErrorIs(t, err, ErrInvalidSpec, "%q", bad)
	}
}

// A PV "expanding" is an open request of the node its affinity names, like
// one "deleting"; its answers are not.
func TestGrowRequestIsOpen(t *testing.T) {
	me := Node{Name: "node-a", Drivers: []string{DefaultDriver}}
	for _, c := range []struct {
		state string
		open  bool
	}{{StateExpanding, true}, {StateDeleting, true}, {StateExpanded, false}, {StateFailed, false}, {"", false}} {
		pv := sweepPV("v", "node-a", DefaultDriver, c.state)
		owned, open := me.Classify(pv)
		assert.True(t, owned)
		assert.Equal(t, c.open, open, c.state)
		_, _, routed := Route(pv)
		assert.Equal(t, c.open, routed, c.state)
		pv.Spec.CSI.Driver = "other.csi"
		pv.Labels = map[string]string{LabelNode: "node-a"}
		assert.Equal(t, c.open, me.Misdirected(pv), c.state)
	}
}

func TestExpandVolume(t *testing.T) {
	ann := map[string]string{AnnSize: "1", AnnSpec: "vg0/pvc-1"}
	for k, v := range stale {
		ann[k] = v
	}
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv", Annotations: ann, ResourceVersion: "1"}}
	c, watching := watchedClient(pv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		size int64
		err  error
	}
	ask := func() chan result {
		done := make(chan result, 1)
		go func() {
			size, err := ExpandVolumeWithAnnotations(ctx, clientset.Wrap(c), "pv", CreateSpec{VolumeGroup: "vg0", Name: "pvc-1", Size: 256 << 20}, nil)
			done <- result{size, err}
		}()
		select {
		case <-watching:
		case r := <-done:
			t.Fatalf("ExpandVolumeWithAnnotations returned before watching: %v", r.err)
		}
		return done
	}
	answer := func(set map[string]string) {
		got, err := c.CoreV1().PersistentVolumes().Get(ctx, "pv", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, StateExpanding, got.Annotations[AnnLifecycle])
		assert.JSONEq(t, `{"volumeGroup":"vg0","name":"pvc-1","size":268435456}`, got.Annotations[AnnSpec])
		for _, k := range []string{AnnReason, AnnError, AnnSize} {
			assert.NotContains(t, got.Annotations, k, "the request clears the earlier answer's %s", k)
		}
		for k, v := range set {
			got.Annotations[k] = v
		}
		_, err = c.CoreV1().PersistentVolumes().Update(ctx, got, metav1.UpdateOptions{})
		require.NoError(t, err)
	}

	done := ask()
	answer(map[string]string{AnnLifecycle: StateFailed, AnnReason: ReasonInsufficientCapacity, AnnError: "VG full"})
	r := <-done
	assert.True(t, errors.Is(r.err, ErrInsufficientCapacity), "%v", r.err)

	done = ask()
	answer(map[string]string{AnnLifecycle: StateExpanded, AnnSize: "272629760"})
	r = <-done
	require.NoError(t, r.err)
	assert.Equal(t, int64(272629760), r.size)
}
