package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
)

// probeHandler: each GET calls the driver's Identity.Probe, within timeout;
// 200 when it answers and is ready (an answer without readiness means ready,
// per the CSI spec), 500 with the reason otherwise.
func probeHandler(conn *grpc.ClientConn, timeout time.Duration) http.Handler {
	client := csi.NewIdentityClient(conn)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		ctx, cancel := context.WithTimeout(req.Context(), timeout)
		defer cancel()
		resp, err := client.Probe(ctx, &csi.ProbeRequest{})
		switch {
		case err != nil:
			http.Error(w, fmt.Sprintf("Probe: %v", err), http.StatusInternalServerError)
		case resp.GetReady() != nil && !resp.GetReady().GetValue():
			http.Error(w, "Probe: the driver is not ready", http.StatusInternalServerError)
		default:
			fmt.Fprintln(w, "ok")
		}
	})
}
