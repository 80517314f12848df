package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/lvm-agent/lvm-agent/kube/apiclient"
)

// Encryption at rest. A class with encryption: luks2 names a Secret that
// holds its key; the provisioner puts EncryptionTag(ref) among the spec's
// tags, so the LV itself says that it is a LUKS2 volume and which Secret
// unlocks it: the agent reads that from the LV when it makes the volume,
// opens it after a reboot, grows it and erases it, whatever form the PV's
// spec has ("vg/lv" names no class). Like every extension, the tag is sent
// only to an agent whose capacity entry says "encryption": "luks2"; an
// agent that does not know it would make a plain LV.

// EncryptionLUKS2 is the one encryption format: the StorageClass
// parameter's value, and StorageCapacity.Encryption's.
const EncryptionLUKS2 = "luks2"

// EncryptionTagPrefix starts the tag of an encrypted LV; the rest is the
// key Secret's "namespace/name".
const EncryptionTagPrefix = "lvm-agent.luks2="

// DefaultKeyNamespace is where key Secrets live unless a class says
// otherwise: lvm-agent's own namespace, the one the agent's Role covers.
const DefaultKeyNamespace = "lvm-agent"

// SecretKeyField is the key Secret's data field, SecretPreviousKeyField
// the class's key before a rotation (docs/day-2.md), and MinKeyBytes the
// shortest key taken. The key unlocks a keyslot with a light key
// derivation (agent/luks2): it must be a random machine key, not a
// passphrase.
const (
	SecretKeyField         = "key"
	SecretPreviousKeyField = "previousKey"
	MinKeyBytes            = 32
	maxKeyBytes            = 1024
)

// Key is a class's key as its Secret holds it: the current one, and the
// one before it while a rotation is under way (nil otherwise).
type Key struct{ Current, Previous []byte }

// Clear overwrites both keys.
func (k *Key) Clear() {
	if k != nil {
		clear(k.Current)
		clear(k.Previous)
	}
}

// KeyRef names a key Secret.
type KeyRef struct{ Namespace, Name string }

func (r KeyRef) String() string { return r.Namespace + "/" + r.Name }

// EncryptionTag is the LVM tag of a volume unlocked by ref's key.
func EncryptionTag(ref KeyRef) string { return EncryptionTagPrefix + ref.String() }

// ParseKeyRef parses "name" (in DefaultKeyNamespace) or "namespace/name".
func ParseKeyRef(s string) (KeyRef, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok {
		ns, name = DefaultKeyNamespace, s
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return KeyRef{}, fmt.Errorf("key Secret %q: namespace: %s", s, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return KeyRef{}, fmt.Errorf("key Secret %q: name: %s", s, strings.Join(errs, "; "))
	}
	return KeyRef{ns, name}, nil
}

// EncryptionOf returns the key Secret an LV's tags name, if any. A tag with
// the prefix that names no valid Secret is an error: the volume is
// encrypted, and nothing must treat it as plain.
func EncryptionOf(tags []string) (KeyRef, bool, error) {
	for _, t := range tags {
		if rest, ok := strings.CutPrefix(t, EncryptionTagPrefix); ok {
			ref, err := ParseKeyRef(rest)
			if err != nil || !strings.Contains(rest, "/") {
				return KeyRef{}, true, fmt.Errorf("%w: tag %q names no key Secret as namespace/name", ErrInvalidSpec, t)
			}
			return ref, true, nil
		}
	}
	return KeyRef{}, false, nil
}

// ErrKeyUnavailable: the key Secret is missing, forbidden to the agent, or
// holds no usable key. The request fails with ReasonKeyUnavailable and
// nothing is made; the provisioner asks again, so the claim recovers once
// the Secret is right.
var ErrKeyUnavailable = errors.New("encryption key unavailable")

// ReadKey reads ref's key. The caller clears what it gets once used
// (Key.Clear); nothing here keeps, logs or prints it. Only namespace, the
// one the agent's Role covers, is read: a ref elsewhere is refused before
// any API call.
func ReadKey(ctx context.Context, c apiclient.Interface, namespace string, ref KeyRef) (*Key, error) {
	if ref.Namespace != namespace {
		return nil, fmt.Errorf("%w: Secret %s is not in namespace %s, the only one this agent reads keys from (--key-namespace)", ErrKeyUnavailable, ref, namespace)
	}
	s, err := c.Secrets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err), apierrors.IsForbidden(err):
		return nil, fmt.Errorf("%w: Secret %s: %v", ErrKeyUnavailable, ref, err)
	case err != nil:
		return nil, fmt.Errorf("read key Secret %s: %w", ref, err)
	}
	defer func() {
		for _, v := range s.Data {
			clear(v)
		}
	}()
	current, err := keyField(s.Data, SecretKeyField, ref)
	if err != nil {
		return nil, err
	}
	k := &Key{Current: current}
	if _, ok := s.Data[SecretPreviousKeyField]; ok {
		if k.Previous, err = keyField(s.Data, SecretPreviousKeyField, ref); err != nil {
			k.Clear()
			return nil, err
		}
	}
	return k, nil
}

// keyField is a copy of one key field of a Secret's data, checked.
func keyField(data map[string][]byte, field string, ref KeyRef) ([]byte, error) {
	raw := data[field]
	switch {
	case len(raw) == 0:
		return nil, fmt.Errorf("%w: Secret %s has no data field %q", ErrKeyUnavailable, ref, field)
	case len(raw) < MinKeyBytes || len(raw) > maxKeyBytes:
		return nil, fmt.Errorf("%w: Secret %s's %q is %d bytes; it must be a random key of %d to %d bytes (head -c 64 /dev/urandom)", ErrKeyUnavailable, ref, field, len(raw), MinKeyBytes, maxKeyBytes)
	}
	return append([]byte(nil), raw...), nil
}
