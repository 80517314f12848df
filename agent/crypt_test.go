package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lvm-agent/lvm-agent/agent/luks2"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend/devmapper"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

// fakeMapper is device-mapper as crypt.go uses it: tables by name, a
// device node (a regular file) under root for each, and a device in use
// that cannot be removed.
type fakeMapper struct {
	root string
	mu   sync.Mutex
	maps map[string][]devmapper.Target
	used map[string]bool
	ops  []string
}

func (m *fakeMapper) Create(_ context.Context, name, _ string, t []devmapper.Target, _ bool) (devmapper.Info, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ops = append(m.ops, "create "+name)
	if _, ok := m.maps[name]; ok {
		return devmapper.Info{}, &devmapper.Error{Op: "DM_DEV_CREATE", Target: name, Kind: devmapper.ErrExists}
	}
	m.maps[name] = t
	p := filepath.Join(m.root, "dev", "mapper", name)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return devmapper.Info{}, err
	}
	return devmapper.Info{Name: name, Major: 253, Minor: 9, LiveTable: true}, os.WriteFile(p, nil, 0o600)
}

func (m *fakeMapper) Reload(_ context.Context, name string, t []devmapper.Target) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ops = append(m.ops, "reload "+name)
	if _, ok := m.maps[name]; !ok {
		return &devmapper.Error{Op: "DM_TABLE_LOAD", Target: name, Kind: devmapper.ErrNotFound}
	}
	m.maps[name] = t
	return nil
}

func (m *fakeMapper) Remove(_ context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ops = append(m.ops, "remove "+name)
	switch _, ok := m.maps[name]; {
	case !ok:
		return &devmapper.Error{Op: "DM_DEV_REMOVE", Target: name, Kind: devmapper.ErrNotFound}
	case m.used[name]:
		return &devmapper.Error{Op: "DM_DEV_REMOVE", Target: name, Kind: devmapper.ErrBusy}
	}
	delete(m.maps, name)
	return os.Remove(filepath.Join(m.root, "dev", "mapper", name))
}

func (m *fakeMapper) Info(_ context.Context, name string) (devmapper.Info, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.maps[name]; !ok {
		return devmapper.Info{}, &devmapper.Error{Op: "DM_DEV_STATUS", Target: name, Kind: devmapper.ErrNotFound}
	}
	return devmapper.Info{Name: name, LiveTable: true}, nil
}

func (m *fakeMapper) table(name string) ([]devmapper.Target, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.maps[name]
	return t, ok
}

func (m *fakeMapper) setUsed(name string, used bool) { m.mu.Lock(); m.used[name] = used; m.mu.Unlock() }

var testKey = []byte("0123456789abcdef0123456789abcdef-class-key")

// startCrypt runs an agent that encrypts, its LVs' devices regular files
// of devSize bytes made by each lvcreate, its keys in Secrets of the
// namespace lvm-agent.
func startCrypt(t *testing.T) (*env, *fakeMapper, string) {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "dev", "vg0"), 0o700))
	m := &fakeMapper{root: root, maps: map[string][]devmapper.Target{}, used: map[string]bool{}}
	e := start(t, Config{deviceRoot: root, Crypt: &Crypt{dm: m, keyNamespace: kube.DefaultKeyNamespace}})
	e.lvm.SetHook(func(op, _, name string) error {
		if op == "create" {
			return os.WriteFile(filepath.Join(root, "dev", "vg0", name), bytes.Repeat([]byte("old tenant "), 2<<20), 0o600)
		}
		return nil
	})
	return e, m, root
}

func (e *env) keySecret(t *testing.T, name string, key []byte) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: kube.DefaultKeyNamespace, Name: name}, Data: map[string][]byte{kube.SecretKeyField: key}}
	_, err := e.client.CoreV1().Secrets(s.Namespace).Create(context.Background(), s, metav1.CreateOptions{})
	require.NoError(t, err)
}

func encryptedSpec(size int64, secret string) map[string]string {
	s, _ := json.Marshal(kube.CreateSpec{VolumeGroup: "thick", Name: "lv1", Size: size,
		Tags: []string{kube.NoWipeTag, kube.EncryptionTag(kube.KeyRef{Namespace: kube.DefaultKeyNamespace, Name: secret})}})
	return spec(string(s))
}

// openHeader opens the LUKS2 header on the LV's device with key.
func openHeader(t *testing.T, root string, key []byte) (*luks2.Volume, error) {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "dev", "vg0", "lv1"))
	require.NoError(t, err)
	defer f.Close()
	st, err := f.Stat()
	require.NoError(t, err)
	return luks2.Open(f, st.Size(), key)
}

const mapping = "luks-thick-lv1"

// An encrypted claim: its LV holds a LUKS2 header the class's key opens,
// its mapping covers the LV after the header, and the answer names the
// mapping. Its delete closes the mapping and erases the header before the
// LV is removed.
func TestEncryptedCreateAndDelete(t *testing.T) {
	e, m, root := startCrypt(t)
	e.keySecret(t, "class-key", testKey)
	pvc := e.pvc(t, "default", "pvc", node, encryptedSpec(8*mib, "class-key"))
	ann := e.waitPVC(t, "default", "pvc")
	require.Equal(t, kube.StateCreated, ann[kube.AnnLifecycle], ann[kube.AnnError])
	assert.Equal(t, "/dev/mapper/"+mapping, ann[kube.AnnDevice])

	lv := e.lv(t, "thick", "lv1")
	require.NotNil(t, lv)
	assert.GreaterOrEqual(t, lv.SizeBytes, uint64(8*mib+luks2.DataOffset), "room for the header and the size asked")
	vol, err := openHeader(t, root, testKey)
	require.NoError(t, err)
	tbl, ok := m.table(mapping)
	require.True(t, ok)
	require.Len(t, tbl, 1)
	assert.Equal(t, "crypt", tbl[0].Type)
	assert.EqualValues(t, (int64(lv.SizeBytes)-luks2.DataOffset)/512, tbl[0].Length)
	assert.Equal(t, vol.TableParams(fmt.Sprintf("%d:%d", lv.Major, lv.Minor)), tbl[0].Params, "the header's volume key, over the LV")
	_, err = openHeader(t, root, []byte("another key of thirty-two bytes, or more"))
	assert.ErrorIs(t, err, luks2.ErrWrongKey)
	assert.EqualValues(t, 1, testutil.ToFloat64(e.metrics.cryptOpens))

	// The claim goes; its PV asks for the delete. A mapping still in use
	// (a Pod's mount) holds it.
	require.NoError(t, e.client.CoreV1().PersistentVolumeClaims("default").Delete(context.Background(), "pvc", metav1.DeleteOptions{}))
	m.setUsed(mapping, true)
	e.pv(t, "pv1", node, pvc.UID, map[string]string{kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: "thick/lv1"})
	require.Eventually(t, func() bool {
		pv, err := e.client.CoreV1().PersistentVolumes().Get(context.Background(), "pv1", metav1.GetOptions{})
		require.NoError(t, err)
		return strings.Contains(pv.Annotations[kube.AnnError], "mapping "+mapping+" is in use")
	}, 10*time.Second, 5*time.Millisecond)
	_, err = openHeader(t, root, testKey)
	require.NoError(t, err, "nothing erased while the mapping is in use")

	m.setUsed(mapping, false)
	ann = e.waitPV(t, "pv1")
	require.Equal(t, kube.StateDeleted, ann[kube.AnnLifecycle], ann[kube.AnnError])
	_, ok = m.table(mapping)
	assert.False(t, ok, "mapping removed")
	assert.Nil(t, e.lv(t, "thick", "lv1"), "LV removed")
	_, err = openHeader(t, root, testKey)
	assert.ErrorIs(t, err, luks2.ErrNotLUKS2, "the header is gone: the key opens nothing")
	head, err := os.ReadFile(filepath.Join(root, "dev", "vg0", "lv1"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(head[:luks2.DataOffset], make([]byte, luks2.DataOffset)), "no key material left")
	assert.EqualValues(t, 1, testutil.ToFloat64(e.metrics.cryptErases))
}

// A key Secret missing, or too short to be a random key: the claim fails
// KeyUnavailable and no LV is made. Once the Secret is right, the request
// asked again is made.
func TestEncryptedKeyUnavailable(t *testing.T) {
	e, _, _ := startCrypt(t)
	e.pvc(t, "default", "pvc", node, encryptedSpec(8*mib, "class-key"))
	ann := e.waitPVC(t, "default", "pvc")
	require.Equal(t, kube.StateFailed, ann[kube.AnnLifecycle])
	assert.Equal(t, kube.ReasonKeyUnavailable, ann[kube.AnnReason])
	assert.Contains(t, ann[kube.AnnError], "no LV is made")
	lvs, err := e.lvm.List("thick")
	require.NoError(t, err)
	assert.Empty(t, lvs)

	e.keySecret(t, "short", []byte("passphrase"))
	e.pvc(t, "default", "pvc2", node, encryptedSpec(8*mib, "short"))
	ann = e.waitPVC(t, "default", "pvc2")
	require.Equal(t, kube.ReasonKeyUnavailable, ann[kube.AnnReason])
	assert.Contains(t, ann[kube.AnnError], "must be a random key of 32")
	assert.NotContains(t, ann[kube.AnnError], "passphrase", "a key never shows in an error")

	e.keySecret(t, "class-key", testKey)
	e.request(t, "default", "pvc", encryptedSpec(8*mib, "class-key"))
	ann = e.waitPVC(t, "default", "pvc")
	require.Equal(t, kube.StateCreated, ann[kube.AnnLifecycle], ann[kube.AnnError])
}

// lv is the fake lvmd's LV of that name (nil: none).
func (e *env) lv(t *testing.T, class, name string) *lvmdfake.LV {
	t.Helper()
	lvs, err := e.lvm.List(class)
	require.NoError(t, err)
	for i := range lvs {
		if lvs[i].Name == name {
			return &lvs[i]
		}
	}
	return nil
}

// request asks for a create again on an answered claim, as a provisioner does.
func (e *env) request(t *testing.T, ns, name string, ann map[string]string) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		kube.AnnLifecycle: ann[kube.AnnLifecycle], kube.AnnSpec: ann[kube.AnnSpec], kube.AnnReason: nil, kube.AnnError: nil}}})
	require.NoError(t, err)
	_, err = e.client.CoreV1().PersistentVolumeClaims(ns).Patch(context.Background(), name, "application/merge-patch+json", patch, metav1.PatchOptions{})
	require.NoError(t, err)
}

// A grow grows the LV (the header's room added), then the mapping, and
// answers the mapping's size.
func TestEncryptedGrow(t *testing.T) {
	e, m, _ := startCrypt(t)
	e.keySecret(t, "class-key", testKey)
	pvc := e.pvc(t, "default", "pvc", node, encryptedSpec(8*mib, "class-key"))
	require.Equal(t, kube.StateCreated, e.waitPVC(t, "default", "pvc")[kube.AnnLifecycle])
	e.pv(t, "pv1", node, pvc.UID, growSpec("thick", 16*mib))
	ann := e.waitGrow(t, "pv1")
	require.Equal(t, kube.StateExpanded, ann[kube.AnnLifecycle], ann[kube.AnnError])
	lv := e.lv(t, "thick", "lv1")
	require.NotNil(t, lv)
	assert.GreaterOrEqual(t, lv.SizeBytes, uint64(16*mib+luks2.DataOffset))
	assert.Equal(t, fmt.Sprint(int64(lv.SizeBytes)-luks2.DataOffset), ann[kube.AnnSize])
	tbl, _ := m.table(mapping)
	assert.EqualValues(t, (int64(lv.SizeBytes)-luks2.DataOffset)/512, tbl[0].Length, "the mapping grown with the LV")
}

// rebooted makes an encrypted claim's volume, then removes its mapping as
// a reboot does, and returns the table it had.
func rebooted(t *testing.T, e *env, m *fakeMapper) []devmapper.Target {
	t.Helper()
	e.keySecret(t, "class-key", testKey)
	e.pvc(t, "default", "pvc", node, encryptedSpec(8*mib, "class-key"))
	require.Equal(t, kube.StateCreated, e.waitPVC(t, "default", "pvc")[kube.AnnLifecycle])
	before, _ := m.table(mapping)
	require.NoError(t, m.Remove(context.Background(), mapping))
	return before
}

// After a reboot (no mapping), the agent opens its encrypted volumes again
// with the same volume key.
func TestOpenEncryptedAfterReboot(t *testing.T) {
	e, m, _ := startCrypt(t)
	before := rebooted(t, e, m)

	// The create's worker may still hold the LV's lock: a pass that finds
	// it busy counts it as not opened, as the agent's retries do.
	require.Eventually(t, func() bool { return e.agent.OpenEncrypted(context.Background()) == 0 }, 10*time.Second, 10*time.Millisecond)
	after, ok := m.table(mapping)
	require.True(t, ok, "opened again")
	assert.Equal(t, before, after, "the same table: the same volume key")
	assert.Zero(t, e.agent.OpenEncrypted(context.Background()), "an open one is left as it is")
}

// A clone keeps its source's encryption: a plain source's clone in an
// encrypted class is refused, nothing made.
func TestEncryptedCloneOfPlainSourceRefused(t *testing.T) {
	e, _, _ := startCrypt(t)
	e.keySecret(t, "class-key", testKey)
	require.NoError(t, e.lvm.Add(lvmdfake.LV{Class: "thin", Name: "src", SizeBytes: 8 * mib, Thin: true, Tags: []string{OwnerTag("src-uid")}}))
	s, _ := json.Marshal(kube.CreateSpec{VolumeGroup: "thin", Name: "clone", Size: 8 * mib, Source: &kube.CloneSource{Name: "src", Kind: kube.CloneSnapshot},
		Tags: []string{kube.EncryptionTag(kube.KeyRef{Namespace: kube.DefaultKeyNamespace, Name: "class-key"})}})
	e.pvc(t, "default", "pvc", node, spec(string(s)))
	ann := e.waitPVC(t, "default", "pvc")
	require.Equal(t, kube.StateFailed, ann[kube.AnnLifecycle])
	assert.Equal(t, kube.ReasonCloneNotSupported, ann[kube.AnnReason])
	assert.Contains(t, ann[kube.AnnError], "is not encrypted")
}

// A rotation: the Secret's key is new and previousKey the one the volume
// was made with. The agent opens the volume with the previous key and
// re-keys it: afterwards the new key opens it and the previous one does
// not.
func TestEncryptedKeyRotation(t *testing.T) {
	e, m, root := startCrypt(t)
	before := rebooted(t, e, m)

	newKey := bytes.Repeat([]byte("n"), 48)
	s, err := e.client.CoreV1().Secrets(kube.DefaultKeyNamespace).Get(context.Background(), "class-key", metav1.GetOptions{})
	require.NoError(t, err)
	s.Data = map[string][]byte{kube.SecretKeyField: newKey, kube.SecretPreviousKeyField: testKey}
	_, err = e.client.CoreV1().Secrets(kube.DefaultKeyNamespace).Update(context.Background(), s, metav1.UpdateOptions{})
	require.NoError(t, err)

	require.Eventually(t, func() bool { return e.agent.OpenEncrypted(context.Background()) == 0 }, 10*time.Second, 10*time.Millisecond)
	after, _ := m.table(mapping)
	assert.Equal(t, before, after, "the same volume key")
	_, err = openHeader(t, root, testKey)
	assert.ErrorIs(t, err, luks2.ErrWrongKey, "the previous key's keyslot is gone")
	_, err = openHeader(t, root, newKey)
	assert.NoError(t, err, "the new key opens it")
}

// An encrypted LV whose header was never written (a create cut short
// after its lvcreate) is removed: there is no key material to erase.
func TestEraseWithoutHeader(t *testing.T) {
	e, _, root := startCrypt(t)
	tag := kube.EncryptionTag(kube.KeyRef{Namespace: kube.DefaultKeyNamespace, Name: "class-key"})
	require.NoError(t, e.lvm.Add(lvmdfake.LV{Class: "thick", Name: "lv1", SizeBytes: 8 * mib, Tags: []string{OwnerTag("gone-uid"), tag, kube.NoWipeTag}}))
	require.NoError(t, os.WriteFile(filepath.Join(root, "dev", "vg0", "lv1"), bytes.Repeat([]byte("old tenant "), 8*mib/11), 0o600))
	e.pv(t, "pv1", node, "gone-uid", map[string]string{kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: "thick/lv1"})
	ann := e.waitPV(t, "pv1")
	require.Equal(t, kube.StateDeleted, ann[kube.AnnLifecycle], ann[kube.AnnError])
	assert.Nil(t, e.lv(t, "thick", "lv1"))
}

// A claim answered before and asked again (the provisioner's wait ended
// first): its live mapping answers, the header is neither written again
// nor opened exclusively (the mapping holds the LV).
func TestEncryptedAskedAgain(t *testing.T) {
	e, m, root := startCrypt(t)
	e.keySecret(t, "class-key", testKey)
	e.pvc(t, "default", "pvc", node, encryptedSpec(8*mib, "class-key"))
	require.Equal(t, kube.StateCreated, e.waitPVC(t, "default", "pvc")[kube.AnnLifecycle])
	before, _ := m.table(mapping)
	head, err := os.ReadFile(filepath.Join(root, "dev", "vg0", "lv1"))
	require.NoError(t, err)

	e.request(t, "default", "pvc", encryptedSpec(8*mib, "class-key"))
	ann := e.waitPVC(t, "default", "pvc")
	require.Equal(t, kube.StateCreated, ann[kube.AnnLifecycle], ann[kube.AnnError])
	assert.Equal(t, "/dev/mapper/"+mapping, ann[kube.AnnDevice])
	after, _ := m.table(mapping)
	assert.Equal(t, before, after)
	again, err := os.ReadFile(filepath.Join(root, "dev", "vg0", "lv1"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(head[:luks2.DataOffset], again[:luks2.DataOffset]), "the header as it was")
	assert.EqualValues(t, 1, testutil.ToFloat64(e.metrics.cryptOpens), "the live mapping kept")
}
