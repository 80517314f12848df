package kube

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The patch carries exactly the keys given: nil removes, and nothing else is sent.
func TestMergePatch(t *testing.T) {
	c := Set(map[string]string{AnnLifecycle: StateCreated}).Remove(AnnError, AnnReason)
	b, err := mergePatch("42", c, nil)
	require.NoError(t, err)
	assert.JSONEq(t, `{"metadata":{"resourceVersion":"42","annotations":{
		"pv.csi.alibabacloud.com/volume.lifecycle":"created",
		"pv.csi.alibabacloud.com/volume.error":null,
		"pv.csi.alibabacloud.com/volume.reason":null}}}`, string(b))
	b, err = mergePatch("", nil, Set(map[string]string{LabelNode: "n"}))
	require.NoError(t, err)
	assert.JSONEq(t, `{"metadata":{"labels":{"pv.csi.alibabacloud.com/volume.node":"n"}}}`, string(b))
}

func TestChangePending(t *testing.T) {
	cur := map[string]string{AnnError: "x"}
	assert.False(t, Set(map[string]string{AnnError: "x"}).Pending(cur))
	assert.True(t, Set(map[string]string{AnnError: "y"}).Pending(cur))
	assert.True(t, Change{}.Remove(AnnError).Pending(cur))
	assert.False(t, Change{}.Remove(AnnReason).Pending(cur))
}

func TestOneLine(t *testing.T) {
	assert.Equal(t, "a b c", OneLine(errors.New("a\n  b\tc\n")))
	long := OneLine(errors.New(strings.Repeat("é", MaxErrorBytes)))
	assert.LessOrEqual(t, len(long), MaxErrorBytes)
	assert.True(t, strings.HasSuffix(long, "..."))
}
