package provisioner

import (
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// StatefulSetOf is the StatefulSet whose volumeClaimTemplates made pvc, or
// nil. It is the rule the StatefulSet controller itself uses to find a
// replica's claim, so it holds whether or not the claim has an owner
// reference (only a persistentVolumeClaimRetentionPolicy gives it one):
// the claim is named <template>-<set>-<ordinal> for one of the set's
// templates and an ordinal the set has now (spec.ordinals.start up to
// start+replicas), and carries the labels of the set's selector, which
// the controller copies onto each claim it makes. A claim that only looks
// like one (a user's claim named so, without the labels) is not.
func StatefulSetOf(pvc *corev1.PersistentVolumeClaim, sets []*appsv1.StatefulSet) *appsv1.StatefulSet {
	for _, set := range sets {
		if set.Namespace != pvc.Namespace || set.DeletionTimestamp != nil || !hasLabels(pvc.Labels, set.Spec.Selector) {
			continue
		}
		for _, tmpl := range set.Spec.VolumeClaimTemplates {
			prefix := tmpl.Name + "-" + set.Name + "-"
			if rest, ok := strings.CutPrefix(pvc.Name, prefix); ok && setHasOrdinal(set, rest) {
				return set
			}
		}
	}
	return nil
}

// hasLabels: the set's matchLabels, all of them (none: no match).
func hasLabels(l map[string]string, sel *metav1.LabelSelector) bool {
	return sel != nil && len(sel.MatchLabels) > 0 && labels.SelectorFromSet(sel.MatchLabels).Matches(labels.Set(l))
}

// setHasOrdinal: s is a decimal ordinal (as the controller writes it: no
// sign, no leading zero) of a replica the set has now.
func setHasOrdinal(set *appsv1.StatefulSet, s string) bool {
	n, err := strconv.Atoi(s)
	if err != nil || strconv.Itoa(n) != s || n < 0 {
		return false
	}
	start, replicas := 0, 1
	if set.Spec.Ordinals != nil {
		start = int(set.Spec.Ordinals.Start)
	}
	if set.Spec.Replicas != nil {
		replicas = int(*set.Spec.Replicas)
	}
	return n >= start && n < start+replicas
}
