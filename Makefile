# The verbs people type. Everything a fresh machine needs is built by the
# scripts below and cached in $(CACHE), keyed by version.
SHELL := /bin/bash
export CGO_ENABLED := 0
# Every build -trimpath, as the guest's binaries and the images are: a
# package then compiles once for vet, the tests and those binaries alike
# (-trimpath is part of Go's build-cache key).
export GOFLAGS := $(strip $(GOFLAGS) -trimpath)
CACHE ?= $(or $(LVM_AGENT_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/lvm-agent)
export LVM_AGENT_CACHE := $(CACHE)

.PHONY: all build test test-unit test-integration test-guest test-node demo demo-helm demo-cli node bench-node bench-peers images bench-cluster bench-lvm bench-dm bench-wipe bench-crypt bench-scale bench-burst bench-memory bench-provision chaos test-faults fuzz vet clean

all: build

# --version: VERSION (the release tag, or v0.0.0-dev between releases) and
# the commit, from scripts/version.sh (the guest and image builds use it
# too); -buildvcs=auto adds vcs.modified and the commit time where the go
# command can read the checkout. make VERSION=v0.3.0 overrides.
LDFLAGS := $(shell VERSION='$(VERSION)' COMMIT='$(COMMIT)' scripts/version.sh)

# Two builds of ./cmd/lvm-agent: bin/lvm-agent, the node agent and the
# operator CLI (-tags nodeagent: no provisioner, no clientset, a third of the
# memory), and bin/lvm-agent-provisioner, everything; "lvm-agent
# provisioner" runs the second from beside the first. Both with grpcnotrace:
# grpc's request tracing (off unless a program turns it on) links
# golang.org/x/net/trace, whose HTML pages' templates stop the linker from
# dropping any unused method of the whole program (3.4 MiB more RSS for the
# agent, docs/benchmarks.md).
build:
	go build -buildvcs=auto -trimpath -tags nodeagent,grpcnotrace -ldflags "$(LDFLAGS)" -o bin/lvm-agent ./cmd/lvm-agent
	go build -buildvcs=auto -trimpath -tags grpcnotrace -ldflags "$(LDFLAGS)" -o bin/lvm-agent-provisioner ./cmd/lvm-agent

# -tags guest only for the packages it changes: a build tag is part of every
# package's build-cache key, so vetting the whole module with it compiled
# every dependency a second time (157 CPU-s cold, measured); the guest's
# test binaries compile these packages' dependencies with the tag anyway.
# Then shellcheck on every tracked shell file (scripts/shellcheck.sh
# installs Debian's package when it is missing).
vet:
	go vet ./...
	go vet -tags guest $$(git grep -l '^//go:build.*guest' -- '*.go' | xargs -n1 dirname | sort -u | sed 's|^|./|')
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	scripts/shellcheck.sh

# The README's test command: unit tests, integration tests against a real
# etcd + kube-apiserver, the in-guest suite against real LVM and lvmd, and
# the full scenario on a real one-node cluster in the guest; and the images
# for both arches (the guest's runs need amd64 only). scripts/test.sh runs
# the steps and prints each one's wall time at the end, also on a failure;
# STEPS='vet unit' runs only those.
test:
	scripts/test.sh $(STEPS)

test-unit:
	go test -count=1 $$(go list ./... | grep -v /integration)

# kubectl: its kustomize renders deploy/; helm (scripts/helm.sh) renders the
# chart. The packages run side by side, ./integration's tests in several
# processes (scripts/integration.sh).
test-integration:
	scripts/integration.sh

test-guest:
	scripts/vm/suite.sh

# The README's first command: a real one-node cluster in the guest
# (kubelet, containerd, kube-proxy, the control plane), deploy/ applied to it
# as a user would, then a Filesystem and a Block PVC used by Pods and
# deleted, each step's command and output shown (scripts/guest/node.sh).
demo:
	scripts/vm/node.sh --timeout 1800 -- --mode demo

# The same with `helm install` of charts/lvm-agent instead of kubectl apply -k,
# then lvm-agent volume status -o json and --version in the agent's container.
demo-helm:
	scripts/vm/node.sh --timeout 1800 -- --mode demo --install helm

# The operator CLI against a bare API server: lvm-agent volume create|delete.
demo-cli:
	scripts/vm/demo-cli.sh

# The same cluster and the whole scenario of issue 13 (docs/testing.md);
# test-node is make test's step, node the verb to run it alone.
node test-node:
	scripts/vm/node.sh

# PVC created -> Pod Running on that cluster, median of RUNS, with its breakdown.
# BENCH: only these of create,grow,clone.
RUNS ?= 5
BENCH ?= create,grow,clone
bench-node:
	scripts/vm/node.sh --timeout 2700 -- --mode bench --runs $(RUNS) --bench $(BENCH)

# lvm-agent beside TopoLVM v0.41.0 on that cluster (docs/bench-peers.md);
# PEERS: scripts/guest/peers.sh's arguments (default: its own, 2 rounds).
PEERS ?=
# One round each took more than 5400 s in the guest (docs/runs/bench-peers.md, run 5).
bench-peers:
	scripts/vm/node.sh --timeout 10800 -- --mode peers --peers "$(PEERS)"

# The images that cluster runs, as tarballs (no container engine).
images:
	scripts/vm/images.sh

# In one guest each: what the agent adds to lvmd; what reading the state of
# 200 LVs costs through lvmbackend/devmapper vs lvs and dmsetup.
bench-lvm:
	scripts/vm/bench.sh lvm

bench-dm:
	scripts/vm/bench.sh dm

# The wipe (issue 64): its rate beside dd's on one LV, and a writer's rate
# on another LV while a 1 GiB LV is wiped at the default --wipe-rate.
# An encrypted class beside the same class plain, on that cluster: PVC -> Bound,
# a Pod's sequential write, the agent's RSS with encrypted volumes open
# (integration/stories/benchcrypt.go).
bench-crypt:
	scripts/vm/node.sh --timeout 2700 -- --mode stories --stories bench-crypt

bench-wipe:
	scripts/vm/bench.sh wipe

# Scale: the agent's costs with 0/10k/50k foreign PVCs+PVs, per watch mode.
bench-scale:
	KUBEBUILDER_ASSETS=$$(scripts/kube-assets.sh) go run ./integration/scale $(ARGS)

# A cluster: N simulated nodes (real agents, fake lvmds) against one API
# server; its cost per transition, a cluster-wide burst, an API server
# restart. Quick: make bench-cluster ARGS='-nodes 1,30 -burst-nodes 30 -restart-nodes 30'
bench-cluster:
	KUBEBUILDER_ASSETS=$$(scripts/kube-assets.sh) go run ./integration/scale -nodes 1,30,100,300 -modes labelled,hybrid,hybrid-alone,all $(ARGS)

# One agent, 100 creates at once, fake lvmd at 1 s per listing: lvmd's
# listings and the burst's time, reads shared and not; then five creates
# one at a time (docs/benchmarks.md).
bench-burst:
	go test -count=1 -run '^$$' -bench 'BurstCreates|CreateOneAtATime' -benchtime 1x ./agent/

# The agent's memory: bin/lvm-agent (make build) against a real API server
# and the fake lvmd, every feature on: RSS and Go heap at rest and after
# 500 volumes; then a thick copy's peak and what it leaves (in-process,
# regular files: the host has no device-mapper). docs/benchmarks.md.
bench-memory: build
	KUBEBUILDER_ASSETS=$$(scripts/kube-assets.sh) go run ./integration/memory -agent-bin bin/lvm-agent $(ARGS) && \
	go test -count=1 -run '^$$' -bench ThickCloneMemory -benchtime 1x ./agent/

# The provisioner: PVC created -> Bound through the real scheduler, PV
# controller, provisioner and agent; median of 20, fake lvmd at 0 ms and 1 s;
# a claim's request raised -> its new capacity (the resizer, the agent); and
# a burst of 20 claims on one node whose fake lvmd takes 6 s per create.
bench-provision:
	export KUBEBUILDER_ASSETS=$$(scripts/kube-assets.sh kube-scheduler kube-controller-manager) && \
	go test -count=1 -run '^$$' -bench 'PVCBound|PVCGrow' -benchtime 20x ./integration/provisioning && \
	go test -count=1 -run '^$$' -bench 'PVCBurst' -benchtime 1x ./integration/provisioning

# Faults: 500 volumes in overlapping waves under agent kills, lvmd outages
# and API server restarts; SEED=N replays a run.
SEED ?= 0
chaos:
	KUBEBUILDER_ASSETS=$$(scripts/kube-assets.sh) go test -count=1 -v -timeout 30m ./integration/chaos -volumes 500 -seed $(SEED)

# Faults on the real node (issue 29), in the guest: the power cut of the
# node's disk (QEMU killed while fsync'd records are written, a second boot
# on the same disk checks them); the same for the whole one-node cluster (a
# StatefulSet's fsync'd writers and claims churning; the cluster started
# again on its state on the disk, audited); then the agent, lvmd, kubelet,
# containerd and kube-apiserver killed during bursts on the cluster of make
# demo, each round audited; lvmd away, the VG full; the bare-metal nodes
# (scripts/vm/faults.sh: its parts, run one by one, took over an hour in
# all under TCG). make test runs its power cut and its kills in one burst
# in its own guest run (docs/testing.md "What make test runs of them").
test-faults:
	scripts/vm/faults.sh

FUZZTIME ?= 10s
fuzz:
	FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

clean:
	rm -rf bin
