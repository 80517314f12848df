# The verbs people type. Everything a fresh machine needs is built by the
# scripts below and cached in $(CACHE), keyed by version.
SHELL := /bin/bash
export CGO_ENABLED := 0
CACHE ?= $(or $(LVM_AGENT_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/lvm-agent)
export LVM_AGENT_CACHE := $(CACHE)

.PHONY: all build test test-unit test-integration test-guest demo bench-lvm fuzz vet clean

all: build

build:
	go build -trimpath -o bin/lvm-agent ./cmd/lvm-agent

vet:
	go vet ./...
	go vet -tags guest ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

# The README's test command: unit tests, integration tests against a real
# etcd + kube-apiserver, and the in-guest suite against real LVM and lvmd.
test: vet test-unit test-integration test-guest

test-unit:
	go test -count=1 $$(go list ./... | grep -v /integration)

test-integration:
	KUBEBUILDER_ASSETS=$$(scripts/kube-assets.sh) go test -count=1 -v ./integration/...

test-guest:
	scripts/vm/suite.sh

demo:
	scripts/vm/demo.sh

bench-lvm:
	scripts/vm/bench-lvm.sh

clean:
	rm -rf bin
