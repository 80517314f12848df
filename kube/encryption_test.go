package kube

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

func TestEncryptionTags(t *testing.T) {
	ref, err := ParseKeyRef("class-key")
	require.NoError(t, err)
	assert.Equal(t, KeyRef{DefaultKeyNamespace, "class-key"}, ref)
	tag := EncryptionTag(KeyRef{"keys", "k.1"})
	assert.Equal(t, "lvm-agent.luks2=keys/k.1", tag)
	got, ok, err := EncryptionOf([]string{"a", tag})
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, KeyRef{"keys", "k.1"}, got)
	_, ok, err = EncryptionOf([]string{"a"})
	assert.False(t, ok)
	assert.NoError(t, err)
	for _, bad := range []string{"lvm-agent.luks2=", "lvm-agent.luks2=k", "lvm-agent.luks2=Keys/k", "lvm-agent.luks2=a/b/c"} {
		_, ok, err := EncryptionOf([]string{bad})
		assert.True(t, ok, "%s still marks an encrypted LV", bad)
		assert.ErrorIs(t, err, ErrInvalidSpec, bad)
	}
	for _, bad := range []string{"", "UPPER", "ns/", "/name", "a/b/c"} {
		_, err := ParseKeyRef(bad)
		assert.Error(t, err, bad)
	}
}

// ReadKey reads only its namespace, takes only random keys, and says why
// without the key's bytes.
func TestReadKey(t *testing.T) {
	ctx := context.Background()
	key, prev := bytes.Repeat([]byte{1}, 64), bytes.Repeat([]byte{2}, 32)
	c := clientset.Wrap(fake.NewClientset(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "lvm-agent", Name: "good"}, Data: map[string][]byte{"key": key}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "lvm-agent", Name: "rotating"}, Data: map[string][]byte{"key": key, "previousKey": prev}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "lvm-agent", Name: "short"}, Data: map[string][]byte{"key": []byte("hunter2")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "lvm-agent", Name: "nokey"}, Data: map[string][]byte{"Key": key}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "good"}, Data: map[string][]byte{"key": key}},
	))
	k, err := ReadKey(ctx, c, "lvm-agent", KeyRef{"lvm-agent", "good"})
	require.NoError(t, err)
	assert.Equal(t, key, k.Current)
	assert.Nil(t, k.Previous)
	k.Clear()
	assert.Equal(t, make([]byte, 64), k.Current, "cleared")

	k, err = ReadKey(ctx, c, "lvm-agent", KeyRef{"lvm-agent", "rotating"})
	require.NoError(t, err)
	assert.Equal(t, prev, k.Previous)

	for name, want := range map[string]string{"short": "is 7 bytes", "nokey": `no data field "key"`, "missing": "not found"} {
		_, err := ReadKey(ctx, c, "lvm-agent", KeyRef{"lvm-agent", name})
		assert.ErrorIs(t, err, ErrKeyUnavailable, name)
		assert.ErrorContains(t, err, want, name)
		assert.NotContains(t, err.Error(), "hunter2", "no key in an error")
	}
	_, err = ReadKey(ctx, c, "lvm-agent", KeyRef{"other", "good"})
	assert.ErrorIs(t, err, ErrKeyUnavailable)
	assert.ErrorContains(t, err, "only one this agent reads keys from")
}
