package lvmbackend

import (
	"context"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Ping asks lvmd's gRPC health service, which answers without running lvm:
// how Direct checks that lvmd is reachable without opening a Watch stream.
func (t *Topolvm) Ping(ctx context.Context) error {
	_, err := healthpb.NewHealthClient(t.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return topolvmError("health", err, ErrUnavailable)
	}
	return nil
}
