# aenv: sandboxes for AI agents and agentic RL, on gVisor.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO        ?= go
BIN       := $(CURDIR)/bin
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/aenv-dev/aenv/internal/cli.Version=$(VERSION)
# The tests' server, nodes and gateways run under the race detector: a cgo
# build, for tests only (users get the static one). It sits in its own dir
# next to links to the static envd and runsc, because the server looks for
# its helpers next to itself, and those run inside sandboxes: static.
RACE_BIN  := $(BIN)/race
DATA_DIR  ?= /var/lib/aenv
GOTEST    ?= $(GO) test
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.6.1
# gotestsum runs the Go tier as go test does (same output) and keeps its
# events, from which the slowest tests are listed after it, pass or fail.
GOTESTSUM := gotest.tools/gotestsum@v1.13.0
CONSOLE_WEB  := internal/console/web
CONSOLE_DIST := internal/console/dist

.PHONY: help
help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "} {printf "  %-12s %s\n", $$1, $$2}'

.PHONY: deps
deps: ## Install the Debian packages aenv needs (root)
	scripts/install-deps.sh

.PHONY: build
build: $(BIN)/aenv $(BIN)/envd $(BIN)/aenv-chart $(BIN)/runsc ## Build aenv, envd, aenv-chart and the pinned runsc into bin/

$(BIN)/aenv: $(CONSOLE_DIST)/app.js FORCE
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $@ ./cmd/aenv

# The web console's scripts and styles (internal/console/web), bundled with
# the npm packages they import by esbuild's Go library (tools/consolebundle,
# a module of its own) into internal/console/dist, which aenv embeds. A build
# without them (plain go build) serves a console page that says so.
$(CONSOLE_DIST)/app.js: $(CONSOLE_WEB)/app.js $(CONSOLE_WEB)/app.css $(CONSOLE_WEB)/package.json $(CONSOLE_WEB)/package-lock.json \
		tools/consolebundle/main.go tools/consolebundle/go.mod
	@command -v npm >/dev/null || { echo "the web console's bundle needs npm: run scripts/install-deps.sh (make deps)" >&2; exit 1; }
	npm ci --prefix $(CONSOLE_WEB) --no-audit --no-fund --loglevel=error
	$(GO) run -C tools/consolebundle . -src $(CURDIR)/$(CONSOLE_WEB) -out $(CURDIR)/$(CONSOLE_DIST)

.PHONY: console
console: $(CONSOLE_DIST)/app.js ## Bundle the web console's scripts and styles into internal/console/dist (npm ci, esbuild)

# The bench's chart (aenv bench --chart): its own binary, so the plotting
# library stays out of aenv.
$(BIN)/aenv-chart: FORCE
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $@ ./cmd/aenv-chart

$(BIN)/envd: FORCE
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $@ ./cmd/envd

$(RACE_BIN)/aenv: $(BIN)/envd $(BIN)/runsc $(BIN)/dnsstub $(CONSOLE_DIST)/app.js FORCE
	mkdir -p $(RACE_BIN)
	CGO_ENABLED=1 $(GO) build -race -ldflags '-X github.com/aenv-dev/aenv/internal/cli.Version=$(VERSION)' -o $@ ./cmd/aenv
	ln -f $(BIN)/envd $(BIN)/runsc $(BIN)/dnsstub $(RACE_BIN)/

# runsc is pinned by the tool line in go.mod. It must be static: a cgo build
# fails at sandbox start (its re-exec needs a loader the chroot lacks). Its
# seccomp filters are precompiled into it (tools/runsc-seccomp), as gVisor's
# release builds do, so that a start or restore does not compile them.
$(BIN)/runsc: go.mod go.sum tools/runsc-seccomp/main.go scripts/build-runsc.sh
	GO=$(GO) scripts/build-runsc.sh $@

# The S3-compatible server the object store tests run against (SeaweedFS),
# pinned by the tool line of its own module so that its dependencies stay out
# of aenv's go.mod.
$(BIN)/weed: tools/weed/go.mod tools/weed/go.sum
	$(GO) build -C tools/weed -o $@ github.com/seaweedfs/seaweedfs/weed

.PHONY: weed
weed: $(BIN)/weed ## Build the S3 server the object store tests use into bin/ (SeaweedFS)

# The ACME server the certificate tests get certificates from (Let's
# Encrypt's pebble), pinned in its own module as weed is.
$(BIN)/pebble: tools/pebble/go.mod tools/pebble/go.sum
	$(GO) build -C tools/pebble -o $@ github.com/letsencrypt/pebble/v2/cmd/pebble

# The Helm CLI the chart's test lints and renders deploy/helm/aenv with,
# pinned in its own module as weed is; the tests need it (test-prepare).
$(BIN)/helm: tools/helm/go.mod tools/helm/go.sum
	$(GO) build -C tools/helm -o $@ helm.sh/helm/v3/cmd/helm

.PHONY: helm
helm: $(BIN)/helm ## Build the Helm CLI the chart's test uses into bin/
test-prepare: $(BIN)/helm

# The tests' DNS server: the E2B SDK suite resolves its https host names
# through it (e2e/hosts.test.mjs).
$(BIN)/dnsstub: FORCE
	CGO_ENABLED=0 $(GO) build -o $@ ./test/dnsstub/cmd/dnsstub

.PHONY: server
server: deps build ## Set up and run the server on its defaults (root; port 8000, data in /var/lib/aenv)
	$(BIN)/aenv server --data-dir $(DATA_DIR)

# Installs as a systemd service (docs/install.md); DESTDIR stages instead,
# for a package or an image, without root, packages or systemctl.
PREFIX  ?= /usr/local
DESTDIR ?=
.PHONY: install
install: build ## Install aenv, envd, runsc, their Debian packages and systemd units (root; PREFIX=/usr/local, DESTDIR)
	PREFIX='$(PREFIX)' DESTDIR='$(DESTDIR)' scripts/install.sh --bin-dir $(BIN)

# The container images of a gateway and a node (docs/images.md), built from
# bin/ without a container engine and dated at the commit, so that the same
# commit gives the same digests. The node's Debian is made by debootstrap
# (root) once, in /var/cache/aenv-images.
.PHONY: images
images: build ## Build the gateway and node container images into bin/images (OCI layout and tarballs; root)
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || echo 0) $(GO) run ./cmd/aenv-images \
		-o $(BIN)/images -bin $(BIN) -version $(VERSION) -debootstrap

.PHONY: generate
generate: ## Regenerate the envd protocol code (api/envd/*.proto) and the control plane's types (api/openapi/aenv.yaml)
	api/envd/generate.sh
	cd internal/wire && $(GO) generate .

.PHONY: lint
lint: ## gofmt, go vet and staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# Tests share one base template build in TEST_CACHE (built once per machine).
TEST_CACHE := /var/cache/aenv-test

.PHONY: test-prepare
test-prepare: build $(BIN)/weed $(BIN)/pebble $(BIN)/dnsstub $(RACE_BIN)/aenv
	d=$$(mktemp -d /tmp/aenv-prepare.XXXXXX); \
	$(BIN)/aenv server --prepare-only --prepare-code-interpreter --api-key prepare --data-dir $$d --template-cache-dir $(TEST_CACHE); \
	rm -rf $$d

# The tiers that start servers run the race-enabled one (RACE_BIN) and fail
# on any race it reports; the CLI's client commands run the static aenv.
GO_TEST_EVENTS ?= $(BIN)/go-tests.json
define GO_TIER
AENV_REQUIRE_ROOT_TESTS=1 AENV_BIN_DIR=$(BIN) AENV_SERVER_BIN=$(RACE_BIN)/aenv \
	$(GO) run $(GOTESTSUM) --format standard-quiet --jsonfile $(GO_TEST_EVENTS) -- -race -count=1 -timeout 80m ./...; \
	status=$$?; echo "Go tests over 60 s:"; $(GO) run $(GOTESTSUM) tool slowest --jsonfile $(GO_TEST_EVENTS) --threshold 60s; exit $$status
endef
.PHONY: test
test: test-prepare ## Run every test: Go (unit, root-only, integration), Python client, E2B SDK end to end, alone and through a gateway (root; nothing is skipped)
	$(GO_TIER)
	AENV_REQUIRE_ROOT_TESTS=1 AENV_LIFECYCLE=1 AENV_BIN=$(RACE_BIN)/aenv sdk/python/run-tests.sh
	AENV_E2E_LIFECYCLE=1 AENV_BIN_DIR=$(RACE_BIN) e2e/run.sh
	AENV_E2E_CLUSTER=1 AENV_BIN_DIR=$(RACE_BIN) e2e/run.sh

.PHONY: test-go
test-go: test-prepare ## Run the Go tests only (root)
	$(GO_TIER)

.PHONY: test-e2e
test-e2e: test-prepare ## Run the E2B SDK end-to-end suite (root)
	AENV_E2E_LIFECYCLE=1 AENV_BIN_DIR=$(RACE_BIN) e2e/run.sh

.PHONY: test-e2e-cluster
test-e2e-cluster: test-prepare ## Run the E2B SDK suite through a gateway over three nodes and a throwaway PostgreSQL (root)
	AENV_E2E_CLUSTER=1 AENV_BIN_DIR=$(RACE_BIN) e2e/run.sh

.PHONY: test-unit
test-unit: ## Run the tests that need neither root nor sandboxes
	$(GOTEST) -race -count=1 -short ./...

.PHONY: bench
bench: build ## The benchmark suite against the running server (AENV_URL, AENV_API_KEY): table, docs/bench.json, docs/bench.png
	$(BIN)/aenv bench --data-dir $(DATA_DIR) --json-out docs/bench.json --chart docs/bench.png

.PHONY: bench-go
bench-go: build ## Go benchmarks of single operations, next to raw runsc and runc (starts its own servers)
	AENV_REQUIRE_ROOT_TESTS=1 AENV_BIN_DIR=$(BIN) $(GOTEST) -run '^$$' -bench . -skip 'ClusterColdCreate|ClusterFork64|TeamLimitBurst|Volume|Console' -benchtime 20x -timeout 30m ./test/integration/

.PHONY: bench-volumes
bench-volumes: build ## Volumes: create with and without one, fork of 8 sharing or copying a 1 GB volume, file throughput on a volume and on the root, a 1 GiB move between nodes beside tar (minutes per run)
	AENV_REQUIRE_ROOT_TESTS=1 AENV_BIN_DIR=$(BIN) $(GOTEST) -run '^$$' -bench 'Volume' -benchtime 3x -timeout 60m ./test/integration/

.PHONY: bench-egress
bench-egress: build ## The egress gateway: first HTTPS request and a 100 MB download by name next to by address, 200 connections from 20 sandboxes
	AENV_REQUIRE_ROOT_TESTS=1 AENV_BIN_DIR=$(BIN) $(GOTEST) -run '^$$' -bench 'Egress' -benchtime 3x -timeout 30m ./test/integration/
	$(GOTEST) -run '^$$' -bench 'GatewayIdleMemory' -benchtime 1x ./internal/egress/

.PHONY: bench-code-interpreter
bench-code-interpreter: build ## The code interpreter: create until the first runCode answers, restored from the warm snapshot, booted, and raw runsc importing the same
	AENV_REQUIRE_ROOT_TESTS=1 AENV_BIN_DIR=$(BIN) $(GOTEST) -run '^$$' -bench 'CodeInterpreter' -benchtime 10x -timeout 30m ./test/integration/

.PHONY: bench-console
bench-console: build ## The web console in headless Chromium: page load with 50 sandboxes (AENV_BENCH_CONSOLE_SANDBOXES=1000: past 40, paused to disk) and terminal echo
	AENV_REQUIRE_ROOT_TESTS=1 AENV_BIN_DIR=$(BIN) $(GOTEST) -run '^$$' -bench Console -benchtime 10x -timeout 30m ./test/integration/

.PHONY: bench-team-burst
bench-team-burst: build ## 500 concurrent creates of one team through two gateways against its limit of 8 (a minute or two per run)
	AENV_REQUIRE_ROOT_TESTS=1 AENV_BIN_DIR=$(BIN) $(GOTEST) -run '^$$' -bench TeamLimitBurst -benchtime 1x -timeout 30m ./test/integration/

.PHONY: bench-shared
bench-shared: build $(BIN)/weed ## The object store in a cluster: 300 MB upload, cold and warm create, fork of 64 over three nodes and one, incremental snapshots of 1 GiB and of a trajectory (minutes per run)
	AENV_REQUIRE_ROOT_TESTS=1 AENV_BIN_DIR=$(BIN) $(GOTEST) -run '^$$' -bench 'ClusterColdCreate|ClusterFork64|ClusterIncrementalSnapshot|RawRunscCheckpointRestore' -benchtime 2x -timeout 60m ./test/integration/

.PHONY: clean-test
clean-test: ## Remove debris a failed test run left (sandboxes, mounts, namespaces, veths)
	scripts/clean-test.sh

.PHONY: clean
clean: ## Remove build outputs
	rm -rf $(BIN)

.PHONY: FORCE
FORCE:
