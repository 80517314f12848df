package provisioner

import (
	"testing"

	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestStatefulSetOf(t *testing.T) {
	set := func(name string, replicas int32, start *int32) *appsv1.StatefulSet {
		s := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: appsv1.StatefulSetSpec{
			Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"}}, {ObjectMeta: metav1.ObjectMeta{Name: "wal"}}}}}
		if start != nil {
			s.Spec.Ordinals = &appsv1.StatefulSetOrdinals{Start: *start}
		}
		return s
	}
	five := int32(5)
	db, web, shifted := set("db", 2, nil), set("web-db", 3, nil), set("s", 2, &five)
	sets := []*appsv1.StatefulSet{db, web, shifted}
	claim := func(ns, name, app string) *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if app != "" {
			c.Labels = map[string]string{"app": app, "other": "x"}
		}
		return c
	}
	for _, c := range []struct {
		name string
		pvc  *corev1.PersistentVolumeClaim
		want *appsv1.StatefulSet
	}{
		{"first template", claim("ns", "data-db-0", "db"), db},
		{"second template", claim("ns", "wal-db-1", "db"), db},
		{"set name with a dash", claim("ns", "data-web-db-2", "web-db"), web},
		{"ordinal past the replicas", claim("ns", "data-db-2", "db"), nil},
		{"ordinals start at 5", claim("ns", "data-s-5", "s"), shifted},
		{"below the start", claim("ns", "data-s-0", "s"), nil},
		{"leading zero", claim("ns", "data-db-01", "db"), nil},
		{"not a number", claim("ns", "data-db-x", "db"), nil},
		{"no selector labels", claim("ns", "data-db-0", ""), nil},
		{"another set's labels", claim("ns", "data-db-0", "web-db"), nil},
		{"unknown template", claim("ns", "logs-db-0", "db"), nil},
		{"other namespace", claim("other", "data-db-0", "db"), nil},
		{"plain claim", claim("ns", "data", ""), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, StatefulSetOf(c.pvc, sets))
		})
	}
	deleting := set("db", 2, nil)
	deleting.DeletionTimestamp = &metav1.Time{}
	assert.Nil(t, StatefulSetOf(claim("ns", "data-db-0", "db"), []*appsv1.StatefulSet{deleting}), "a set being deleted makes no new claim")
}
