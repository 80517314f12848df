// Package kubefake makes client-go's fake clientset keep the promises of
// the API server that the tests of lvm-agent's conditional writes depend on.
package kubefake

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"sync"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// Versioned makes c keep a resourceVersion on the objects of the resources,
// as the API server does: every create, update and merge patch stores the
// object with a new one, an update or a merge patch that names another
// than the object has is refused with a 409 Conflict, and so is a write to
// an object deleted and made again. client-go's object tracker versions
// its objects only for its watches, never in their metadata, so without
// this a test cannot see whether a conditional write would have landed.
// seen, when not nil, is told each merge patch's resourceVersion ("" for
// none). A merge patch that changes nothing keeps the version, as the
// API server's does.
func Versioned(c *fake.Clientset, seen func(rv string), resources ...string) {
	var mu sync.Mutex
	rv := 1000000 // above the versions tests write themselves
	next := func() string {
		mu.Lock()
		defer mu.Unlock()
		rv++
		return strconv.Itoa(rv)
	}
	conflict := func(a clienttesting.Action, name string) error {
		return apierrors.NewConflict(a.GetResource().GroupResource(), name,
			errors.New("the object has been modified; please apply your changes to the latest version and try again"))
	}
	for _, resource := range resources {
		c.PrependReactor("create", resource, func(a clienttesting.Action) (bool, runtime.Object, error) {
			if o, err := meta.Accessor(a.(clienttesting.CreateAction).GetObject()); err == nil {
				o.SetResourceVersion(next())
			}
			return false, nil, nil
		})
		c.PrependReactor("update", resource, func(a clienttesting.Action) (bool, runtime.Object, error) {
			o, err := meta.Accessor(a.(clienttesting.UpdateAction).GetObject())
			if err != nil {
				return false, nil, nil
			}
			if cur, err := c.Tracker().Get(a.GetResource(), a.GetNamespace(), o.GetName()); err == nil && o.GetResourceVersion() != "" {
				if m, _ := meta.Accessor(cur); m.GetResourceVersion() != o.GetResourceVersion() {
					return true, nil, conflict(a, o.GetName())
				}
			}
			o.SetResourceVersion(next())
			return false, nil, nil
		})
		c.PrependReactor("patch", resource, func(a clienttesting.Action) (bool, runtime.Object, error) {
			p := a.(clienttesting.PatchAction)
			if p.GetPatchType() != types.MergePatchType {
				return false, nil, nil
			}
			cur, err := c.Tracker().Get(a.GetResource(), a.GetNamespace(), p.GetName())
			if err != nil {
				return false, nil, nil // the tracker answers: not found
			}
			var asked struct {
				Metadata struct {
					ResourceVersion string `json:"resourceVersion"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(p.GetPatch(), &asked); err != nil {
				return true, nil, apierrors.NewBadRequest(err.Error())
			}
			if seen != nil {
				seen(asked.Metadata.ResourceVersion)
			}
			m, _ := meta.Accessor(cur)
			if asked.Metadata.ResourceVersion != "" && asked.Metadata.ResourceVersion != m.GetResourceVersion() {
				return true, nil, conflict(a, p.GetName())
			}
			old, err := json.Marshal(cur)
			if err != nil {
				return true, nil, err
			}
			merged, err := jsonpatch.MergePatch(old, p.GetPatch())
			if err != nil {
				return true, nil, apierrors.NewBadRequest(err.Error())
			}
			obj := reflect.New(reflect.TypeOf(cur).Elem()).Interface().(runtime.Object)
			if err := json.Unmarshal(merged, obj); err != nil {
				return true, nil, apierrors.NewBadRequest(err.Error())
			}
			if now, err := json.Marshal(obj); err == nil && bytes.Equal(now, old) {
				// A patch that changes nothing is not written: the API
				// server keeps the version (and sends no watch event), so
				// such a write is no fence against a writer that read the
				// same version.
				return true, cur.DeepCopyObject(), nil
			}
			o, _ := meta.Accessor(obj)
			o.SetResourceVersion(next())
			if err := c.Tracker().Update(a.GetResource(), obj, a.GetNamespace()); err != nil {
				return true, nil, err
			}
			return true, obj.DeepCopyObject(), nil
		})
	}
}
