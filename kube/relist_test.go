package kube

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestRelistSpread(t *testing.T) {
	const pvcs = "https://api/api/v1/persistentvolumeclaims"
	steps := []struct {
		url     string
		delayed bool
	}{
		{pvcs + "?labelSelector=a%3Db&limit=500", false},                         // the first list
		{pvcs + "?labelSelector=a%3Db&limit=500&continue=tok", false},            // its next page
		{pvcs + "?labelSelector=a%3Db&limit=500", true},                          // a re-list
		{pvcs + "?labelSelector=%21a&limit=500", false},                          // another selector's first list
		{pvcs + "?watch=true&resourceVersion=10&labelSelector=a%3Db", false},     // a watch that resumes
		{pvcs + "?watch=true&sendInitialEvents=true&labelSelector=a%3Db", false}, // the first streamed list
		{pvcs + "?watch=true&sendInitialEvents=true&labelSelector=a%3Db", true},
		{"https://api/api/v1/namespaces/ns/persistentvolumeclaims/x", false}, // a get
		{"https://api/api/v1/namespaces/ns/persistentvolumeclaims/x", false},
		{"https://api/api/v1/persistentvolumes?limit=500", false},
		{"https://api/api/v1/persistentvolumes?limit=500", true},
	}
	var slept []time.Duration
	sent := 0
	rt := RelistSpread(10 * time.Second)(roundTripFunc(func(*http.Request) (*http.Response, error) { sent++; return &http.Response{}, nil }))
	s := rt.(*relistSpread)
	s.sleep = func(_ context.Context, d time.Duration) { slept = append(slept, d) }
	s.pick = func(d time.Duration) time.Duration { return d / 2 }
	for i, st := range steps {
		before := len(slept)
		req, err := http.NewRequest(http.MethodGet, st.url, nil)
		require.NoError(t, err)
		_, err = rt.RoundTrip(req)
		require.NoError(t, err)
		assert.Equal(t, i+1, sent)
		if st.delayed {
			require.Len(t, slept, before+1, "step %d: %s", i, st.url)
			assert.Equal(t, 5*time.Second, slept[before])
		} else {
			assert.Len(t, slept, before, "step %d: %s", i, st.url)
		}
	}

	// A request whose context ends while it waits is not sent.
	ctx, cancel := context.WithCancel(context.Background())
	s.sleep = func(context.Context, time.Duration) { cancel() }
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, pvcs+"?labelSelector=a%3Db&limit=500", nil)
	require.NoError(t, err)
	_, err = rt.RoundTrip(req)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, len(steps), sent)

	// Off: the next transport itself.
	next := roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, nil })
	_, isSpread := RelistSpread(0)(next).(*relistSpread)
	assert.False(t, isSpread)
}
