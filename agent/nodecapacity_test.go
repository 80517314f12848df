package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// storageTopology is the annotation's value for a report.
func storageTopology(caps []lvmbackend.Capacity, classes map[string]string) string {
	return kube.EncodeStorageTopology(capacityEntries(caps, classes, false, false, false, ""))
}

func TestStorageTopology(t *testing.T) {
	caps := []lvmbackend.Capacity{
		{DeviceClass: "ssd", SizeBytes: 100, FreeBytes: 60},
		{DeviceClass: "hdd", SizeBytes: 1000, FreeBytes: 1000},
	}
	for _, tc := range []struct {
		name    string
		caps    []lvmbackend.Capacity
		classes map[string]string
		want    string
	}{
		{"no classes", nil, nil, `[]`},
		{"default names, sorted", caps, nil,
			`[{"type":"lvm","name":"hdd","capacity":1000,"free":1000,"deviceClass":"hdd"},{"type":"lvm","name":"ssd","capacity":100,"free":60,"deviceClass":"ssd"}]`},
		{"a mapped volume group is listed besides the class's own name", caps, map[string]string{"vg-fast": "ssd"},
			`[{"type":"lvm","name":"hdd","capacity":1000,"free":1000,"deviceClass":"hdd"},{"type":"lvm","name":"ssd","capacity":100,"free":60,"deviceClass":"ssd"},{"type":"lvm","name":"vg-fast","capacity":100,"free":60,"deviceClass":"ssd"}]`},
		{"a class whose own name is mapped elsewhere is listed only under its mapped names", caps, map[string]string{"ssd": "hdd", "vg-fast": "ssd"},
			`[{"type":"lvm","name":"hdd","capacity":1000,"free":1000,"deviceClass":"hdd"},{"type":"lvm","name":"ssd","capacity":1000,"free":1000,"deviceClass":"hdd"},{"type":"lvm","name":"vg-fast","capacity":100,"free":60,"deviceClass":"ssd"}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, storageTopology(tc.caps, tc.classes))
		})
	}
}

const ncNode = "node-capacity"

// ncRun is a NodeCapacity running on a fake clock that says which timers
// Run sets, and whose syncs are heard as they end.
type ncRun struct {
	*NodeCapacity
	clock  *testingclock.FakeClock
	timers chan time.Duration
	syncs  chan error
}

// ncClock is a fake clock that reports each timer Run sets, once set.
type ncClock struct {
	*testingclock.FakeClock
	timers chan<- time.Duration
}

func (c ncClock) After(d time.Duration) <-chan time.Time {
	ch := c.FakeClock.After(d)
	c.timers <- d
	return ch
}

func ncStart(t *testing.T, client *fake.Clientset, minChange ...float64) *ncRun {
	t.Helper()
	n := NewNodeCapacity(clientset.Wrap(client), ncNode, kube.DefaultCapacityAnnotation, nil, nil)
	r := &ncRun{NodeCapacity: n, clock: testingclock.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		timers: make(chan time.Duration, 100), syncs: make(chan error, 100)}
	n.clock = ncClock{FakeClock: r.clock, timers: r.timers}
	n.synced = func(err error) { r.syncs <- err }
	for _, m := range minChange {
		n.MinChange = m
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// elapse waits until Run has taken every report and word of lvmd lost and
// set a timer, then lets that timer's time pass; it returns the timer's.
func (r *ncRun) elapse(t *testing.T) time.Duration {
	t.Helper()
	d := ncAwait(t, r.timers, "Run sets a timer")
	require.Eventually(t, func() bool { return len(r.updates) == 0 && len(r.lost) == 0 }, 5*time.Second, time.Millisecond, "Run takes the reports")
	r.clock.Step(d)
	return d
}

// synced waits for Run's next sync to end: Run has looked at what it was
// told, and written or not.
func (r *ncRun) synced(t *testing.T) error {
	t.Helper()
	return ncAwait(t, r.syncs, "Run syncs")
}

func ncAwait[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(5 * time.Second):
		require.FailNow(t, "timed out: "+what)
	}
	var zero T
	return zero
}

func ncNodePatches(c *fake.Clientset) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == "patch" && a.GetResource().Resource == "nodes" {
			n++
		}
	}
	return n
}

func ncAnnotation(t *testing.T, c *fake.Clientset) string {
	t.Helper()
	node, err := c.CoreV1().Nodes().Get(context.Background(), ncNode, metav1.GetOptions{})
	require.NoError(t, err)
	return node.Annotations[kube.DefaultCapacityAnnotation]
}

func ncCaps(free uint64) []lvmbackend.Capacity {
	return []lvmbackend.Capacity{{DeviceClass: "vg1", SizeBytes: 1 << 30, FreeBytes: free}}
}

// ncUnreachable is the annotation while lvmd is away.
const ncUnreachable = `[{"type":"lvm","name":"vg1","capacity":1073741824,"free":0,"deviceClass":"vg1","lvmdUnreachable":true}]`

func TestNodeCapacityWritesOncePerChange(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: ncNode, Annotations: map[string]string{"other": "kept"}}})
	n := ncStart(t, client)
	n.Update(ncCaps(100))
	assert.Equal(t, n.Debounce, n.elapse(t))
	require.NoError(t, n.synced(t))
	assert.Equal(t, storageTopology(ncCaps(100), nil), ncAnnotation(t, client))
	assert.Equal(t, 1, ncNodePatches(client))

	// The same report again (lvmd's periodic message): looked at, no write.
	n.Update(ncCaps(100))
	n.Update(ncCaps(100))
	n.elapse(t)
	require.NoError(t, n.synced(t))
	assert.Equal(t, 1, ncNodePatches(client))

	// A burst within the debounce window: one write, of the last report.
	for free := uint64(10); free <= 50; free += 10 {
		n.Update(ncCaps(free))
	}
	n.elapse(t)
	require.NoError(t, n.synced(t))
	assert.Equal(t, storageTopology(ncCaps(50), nil), ncAnnotation(t, client))
	assert.Equal(t, 2, ncNodePatches(client))
	assert.Equal(t, "kept", ncNode0(t, client).Annotations["other"], "only our key is written")
}

func ncNode0(t *testing.T, c *fake.Clientset) *corev1.Node {
	t.Helper()
	node, err := c.CoreV1().Nodes().Get(context.Background(), ncNode, metav1.GetOptions{})
	require.NoError(t, err)
	return node
}

func TestWorthWriting(t *testing.T) {
	enc := func(free ...uint64) string {
		var e []kube.StorageCapacity
		for i, f := range free {
			name := fmt.Sprintf("vg%d", i)
			e = append(e, kube.StorageCapacity{Type: "lvm", Name: name, Capacity: 1000, Free: f, DeviceClass: name})
		}
		return kube.EncodeStorageTopology(e)
	}
	for _, tc := range []struct {
		name           string
		known, desired string
		minChange      float64
		want           bool
	}{
		{"equal", enc(500), enc(500), 0.01, false},
		{"under the fraction of free shown", enc(500), enc(496), 0.01, false},
		{"at it", enc(500), enc(495), 0.01, true},
		{"growing, under it", enc(500), enc(504), 0.01, false},
		{"growing, at it", enc(500), enc(505), 0.01, true},
		{"0: every change", enc(500), enc(499), 0, true},
		{"to 0", enc(1), enc(0), 0.01, true},
		{"from 0", enc(0), enc(1), 0.01, true},
		{"one class of two", enc(500, 800), enc(500, 700), 0.01, true},
		{"a class more", enc(500), enc(500, 800), 0.01, true},
		{"another size", enc(500), `[{"type":"lvm","name":"vg0","capacity":2000,"free":500,"deviceClass":"vg0"}]`, 0.01, true},
		{"known without free (the original format)", `[{"type":"lvm","name":"vg0","capacity":1000}]`, enc(1000), 0.01, true},
		{"known unreadable", "", enc(500), 0.01, true},
		// An upgraded agent publishes what it now can, however little free moved.
		{"an ability more", enc(500), `[{"type":"lvm","name":"vg0","capacity":1000,"free":500,"deviceClass":"vg0","grow":true}]`, 0.01, true},
		{"another clone kind", `[{"type":"lvm","name":"vg0","capacity":1000,"free":500,"deviceClass":"vg0","clone":"copy"}]`, enc(500), 0.01, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, worthWriting(tc.known, tc.desired, tc.minChange))
		})
	}
}

// Small changes add up: the annotation is written once they reach MinChange
// of the free bytes it shows.
func TestNodeCapacityMinChange(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: ncNode}})
	n := ncStart(t, client, 0.1)
	n.Update(ncCaps(1000))
	n.elapse(t)
	require.NoError(t, n.synced(t))
	assert.Equal(t, storageTopology(ncCaps(1000), nil), ncAnnotation(t, client))
	for _, free := range []uint64{980, 950, 920} { // under 10% of 1000: not written
		n.Update(ncCaps(free))
		n.elapse(t)
		require.NoError(t, n.synced(t))
		assert.Equal(t, 1, ncNodePatches(client), "free %d", free)
	}
	n.Update(ncCaps(900)) // 10% of 1000
	n.elapse(t)
	require.NoError(t, n.synced(t))
	assert.Equal(t, storageTopology(ncCaps(900), nil), ncAnnotation(t, client))
	assert.Equal(t, 2, ncNodePatches(client))
}

// After a restart the agent reads the Node first: an unchanged value is not written.
func TestNodeCapacityNoWriteAfterRestart(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: ncNode,
		Annotations: map[string]string{kube.DefaultCapacityAnnotation: storageTopology(ncCaps(100), nil)}}})
	n := ncStart(t, client)
	n.Update(ncCaps(100))
	n.elapse(t)
	require.NoError(t, n.synced(t))
	read := false
	for _, a := range client.Actions() {
		read = read || a.GetVerb() == "get" && a.GetResource().Resource == "nodes"
	}
	assert.True(t, read, "the Node is read")
	assert.Equal(t, 0, ncNodePatches(client))
}

// A missing Node is not an error that stops the updater: it writes once the Node exists.
func TestNodeCapacityMissingNode(t *testing.T) {
	client := fake.NewClientset()
	n := ncStart(t, client)
	n.Update(ncCaps(100))
	n.elapse(t)
	require.True(t, apierrors.IsNotFound(n.synced(t)), "the first sync finds no Node")
	_, err := client.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: ncNode}}, metav1.CreateOptions{})
	require.NoError(t, err)
	n.elapse(t) // the retry's backoff
	require.NoError(t, n.synced(t))
	assert.Equal(t, storageTopology(ncCaps(100), nil), ncAnnotation(t, client))
}

// An annotation removed by someone else comes back at the next resync.
func TestNodeCapacityResync(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: ncNode}})
	n := NewNodeCapacity(clientset.Wrap(client), ncNode, "example.com/capacity", map[string]string{"vg-a": "vg1"}, nil)
	n.Debounce, n.Resync = 10*time.Millisecond, 200*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	n.Update(ncCaps(7))
	want := storageTopology(ncCaps(7), map[string]string{"vg-a": "vg1"})
	get := func() string {
		node, err := client.CoreV1().Nodes().Get(context.Background(), ncNode, metav1.GetOptions{})
		require.NoError(t, err)
		return node.Annotations["example.com/capacity"]
	}
	require.Eventually(t, func() bool { return get() == want }, 5*time.Second, 10*time.Millisecond)
	assert.Contains(t, want, `"name":"vg-a"`)
	_, err := client.CoreV1().Nodes().Patch(context.Background(), ncNode, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"example.com/capacity":null}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return get() == want }, 5*time.Second, 10*time.Millisecond)
}

// lvmd away for longer than Away: every entry says so, with nothing free;
// its next report puts the figures back. An outage shorter than Away
// writes nothing.
func TestNodeCapacityLvmdAway(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: ncNode}})
	n := ncStart(t, client)
	n.Update(ncCaps(100))
	n.elapse(t)
	require.NoError(t, n.synced(t))
	assert.Equal(t, 1, ncNodePatches(client))

	n.Lost()
	assert.Equal(t, n.Away, ncAwait(t, n.timers, "Run times lvmd's absence"))
	n.clock.Step(n.Away / 2)
	n.Update(ncCaps(100)) // back within Away
	n.elapse(t)
	require.NoError(t, n.synced(t))
	n.clock.Step(n.Away) // past the absence's end: nothing left to say
	n.Update(ncCaps(100))
	n.elapse(t)
	require.NoError(t, n.synced(t), "the sync after it: Run looked")
	assert.Equal(t, 1, ncNodePatches(client), "back within Away: nothing written")

	n.Lost()
	assert.Equal(t, n.Away, n.elapse(t))
	require.NoError(t, n.synced(t))
	assert.Equal(t, ncUnreachable, ncAnnotation(t, client))
	assert.Equal(t, 2, ncNodePatches(client))
	n.Lost() // each reconnect that fails says it again: no write, no timer
	require.Eventually(t, func() bool { return len(n.lost) == 0 }, 5*time.Second, time.Millisecond, "Run takes it")
	n.clock.Step(n.Away)

	n.Update(ncCaps(90))
	assert.Equal(t, n.Debounce, n.elapse(t), "the report's timer, the only one")
	require.NoError(t, n.synced(t))
	assert.Equal(t, storageTopology(ncCaps(90), nil), ncAnnotation(t, client))
	assert.Equal(t, 3, ncNodePatches(client), "one write since unreachable: the report's")
}

// An agent that never reached lvmd since it started marks the entries the
// Node shows (from before its restart): they are not lvmd's figures now.
func TestNodeCapacityLvmdAwayFromTheStart(t *testing.T) {
	before := storageTopology(ncCaps(100), nil)
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: ncNode,
		Annotations: map[string]string{kube.DefaultCapacityAnnotation: before}}})
	n := ncStart(t, client)
	n.Lost()
	n.elapse(t)
	require.NoError(t, n.synced(t))
	assert.Equal(t, ncUnreachable, ncAnnotation(t, client))
	n.Update(ncCaps(100))
	n.elapse(t)
	require.NoError(t, n.synced(t))
	assert.Equal(t, before, ncAnnotation(t, client))
}
