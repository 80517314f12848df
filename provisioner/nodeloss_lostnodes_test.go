package provisioner

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLostNodes(t *testing.T) {
	var off *LostNodes
	_, lost := off.Lost("a")
	assert.False(t, lost, "off: no node is lost")
	ctx, cancel := off.Watch(context.Background(), "a")
	cancel()
	require.ErrorIs(t, ctx.Err(), context.Canceled)

	l := NewLostNodes()
	waiting, stop := l.Watch(context.Background(), "a")
	defer stop()
	other, stopOther := l.Watch(context.Background(), "b")
	defer stopOther()
	l.set("a", LostOutOfService)
	<-waiting.Done()
	assert.ErrorIs(t, context.Cause(waiting), ErrNodeLost)
	assert.NoError(t, other.Err(), "another node's wait goes on")
	reason, lost := l.Lost("a")
	assert.True(t, lost)
	assert.Equal(t, LostOutOfService, reason)
	late, _ := l.Watch(context.Background(), "a")
	assert.ErrorIs(t, context.Cause(late), ErrNodeLost, "a wait on a node lost already ends at once")
	l.set("a", "")
	_, lost = l.Lost("a")
	assert.False(t, lost, "back")
}
