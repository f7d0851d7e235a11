# confshim — see README.md. Every target works on a fresh machine with Go installed.
GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
ADMIN_KEY ?= confshim-demo-key
BENCHTIME ?= 1s
FUZZTIME  ?= 60s
STATICCHECK_VERSION ?= v0.8.2
GOVULNCHECK_VERSION ?= v1.9.0
PROMTOOL  ?= promtool
# bash with pipefail: a target that pipes go test through grep fails when the tests do
SHELL     := /bin/bash
.SHELLFLAGS := -o pipefail -c

.PHONY: all build test test-suites run bench bench-paced load soak model enumerate lint vulncheck monitoring fuzz integration docker image-test clean

all: test build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/confshim ./cmd/confshim
	$(GO) build -o bin/apisix-standalone ./integration/cmd/apisix-standalone

# lint, the alert rules' tests, the race-enabled suite, then the tests that measure
# memory (only meaningful without -race), the contract model at 100 steps per combination
# (12 under -race) with the 2 MiB validate-cap test and the watch's 11 MB growth test
# (both skipped under -race: sizes, not concurrency), and the sync machine's answer
# sequences at their
# default size (at most 2 faults; under -race the suite runs the set of 1, as the set of 2
# would take five times as long); the last line says how long it all took, passed or
# failed. The Docker-bound tests live behind the build module integration/containers (make
# integration), the soak behind `soak`, the load behind `load`.
test:
	@start=$$(date +%s); rc=0; \
	$(MAKE) --no-print-directory lint monitoring test-suites || rc=$$?; \
	echo "make test: $$([ $$rc = 0 ] && echo passed || echo FAILED) in $$(( $$(date +%s) - start )) s"; \
	exit $$rc

# the suites alone (make test without lint and the alert rules)
test-suites:
	$(GO) test -race -count=1 ./...
	MODEL_STEPS=100 $(GO) test -count=1 -run 'TestMemory|TestLargeBodies|TestMonitoring|TestContractModel|TestFallbackOverTheValidateCap' ./integration/
	$(GO) test -count=1 -run 'TestEveryAnswerSequence' ./internal/syncmachine/
	$(GO) test -count=1 -run 'TestWatchKeepsItsBudgetAfterGrowth' ./internal/reseed/

# The emulated APISIX data plane on 127.0.0.1:9180 and confshim in front of it on :9280.
# The log is confshim's; EMULATOR_FLAGS=-v adds the emulator's line per request (one
# HEAD /apisix/admin a second: confshim's ping). Ctrl-C stops both.
EMULATOR_FLAGS ?=
run: build
	@bin/apisix-standalone --listen 127.0.0.1:9180 --admin-key $(ADMIN_KEY) $(EMULATOR_FLAGS) & emu=$$!; \
	trap 'kill $$emu 2>/dev/null' EXIT INT TERM; \
	sleep 0.3; \
	echo "try: curl -s -H 'X-API-KEY: $(ADMIN_KEY)' http://127.0.0.1:9280/apisix/admin/configs"; \
	bin/confshim --upstream http://127.0.0.1:9180 --log-format console

bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -count 6 ./rewrite/ ./integration/ | tee bench.txt

# Syncs sent at a network's pace (1 Gbit/s, 100 Mbit/s; 10k and 40k routes): what
# confshim adds after the client's last byte, as multiples of ValidateBytes. Slow
# (40k at 100 Mbit/s is 4 s a sync), so apart from bench.
bench-paced:
	$(GO) test -run '^$$' -bench BenchmarkPacedSync -benchtime 5x -count 3 ./integration/ | tee bench-paced.txt

# 8 ADC-like clients on loopback for LOAD_DURATION (default 30s) per target.
load:
	$(GO) test -tags load -count=1 -run TestLoad -v ./integration/ | grep -E '^load|^(ok|FAIL|---)'

# The binary against the emulator through SOAK_DURATION (default 2m) of seeded events:
# changes, out-of-band secrets, leader changes, data-plane restarts at every point of a
# sync, confshim restarts with and without --state-dir; then the state-only restart tests
# at 20,000 routes. SOAK_SEED=<seed> replays a run.
soak:
	$(GO) test -tags soak -count=1 -run 'TestSoak|TestStateOnlyRestart|TestTrustAlways' -v -timeout 30m ./integration/ | grep -E '^(=== RUN|---|ok|FAIL|\s+soak_test)'

# The contract as a model (integration/model_test.go) over every flag combination for
# MODEL_DURATION (default 5m) per combination and seed, MODEL_SEEDS seeds drawn from the
# clock (default 1); a failure prints MODEL_SEED and MODEL_FLAGS to replay it.
MODEL_DURATION ?= 5m
MODEL_SEEDS    ?= 1
model:
	for i in $$(seq $(MODEL_SEEDS)); do \
		MODEL_RANDOM=1 MODEL_STEPS=100000000 MODEL_DURATION=$(MODEL_DURATION) $(GO) test -count=1 -run 'TestContractModel' -v -timeout 0 ./integration/ | grep -E '^(---|ok|FAIL|\s+model_test)' || exit 1; \
	done

# Every sequence of APISIX answers to the sync machine's calls with at most
# ENUMERATE_FAULTS answers that are not the emulated APISIX's own (a racing write, no
# answer, a lost answer, a restart, the budget or deadline running out, slow workers,
# a dict too small, a racing write past the budget, an operator's +1 racing a merged
# section sent at vS+1), checked from the data plane (internal/syncmachine/
# enumerate_test.go). make test runs the set of 2; each fault more is seven to ten times
# the sequences (1: 1,214, 2: 11,785 in 8 s, 3: 84,434 in about 2 min on 2 cores).
ENUMERATE_FAULTS ?= 3
enumerate:
	ENUMERATE_FAULTS=$(ENUMERATE_FAULTS) $(GO) test -count=1 -run 'TestEveryAnswerSequence' -v -timeout 0 ./internal/syncmachine/ | grep -E '^(---|ok|FAIL|\s+enumerate_test)'

# gofmt, go vet, staticcheck and govulncheck (pinned; go run fetches them from the module
# proxy on a fresh machine) and go.mod/go.sum as go mod tidy would leave them.
lint:
	@sh tools/no-build-outputs.sh
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	@$(MAKE) --no-print-directory vulncheck
	$(GO) mod tidy -diff

# govulncheck against the Go vulnerability database (vuln.go.dev): a known vulnerability
# in code confshim reaches fails. A machine that reaches the module proxy but not the
# database (no network beyond the package registries) cannot check: it says SKIPPED and
# why, and VULNCHECK=require makes that an error. (go run exits 1 for govulncheck's
# exit 3, vulnerabilities found, as for any failure: the database error is told by its
# message.) VULNDB=<url> checks against a mirror of the database (govulncheck -db, e.g.
# file:///srv/vulndb).
vulncheck:
	@out=$$($(GO) run golang.org/x/vuln/cmd/govulncheck@$(GOVULNCHECK_VERSION) $(if $(VULNDB),-db $(VULNDB)) ./... 2>&1); rc=$$?; \
	if [ $$rc = 0 ]; then \
		echo "govulncheck $(GOVULNCHECK_VERSION): $$(echo "$$out" | tail -1)"; \
	elif [ "$(VULNCHECK)" != require ] && echo "$$out" | grep -q '^govulncheck: fetching vulnerabilities'; then \
		echo "SKIPPED govulncheck: the vulnerability database cannot be reached: $$(echo "$$out" | grep '^govulncheck: fetching' | head -1)"; \
	else \
		echo "$$out"; exit 1; \
	fi

# promtool check + unit tests of deploy/monitoring's alerts. promtool comes with Debian's
# prometheus package. When it is missing: as root (CI, a fresh machine) it is installed
# with apt-get; as anyone else the alert tests are skipped with a line saying how to run
# them (make never calls sudo). MONITORING=require makes a missing promtool an error.
monitoring:
	@if ! command -v $(PROMTOOL) >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing promtool (Debian package prometheus)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
		elif [ "$(MONITORING)" = require ]; then \
			echo "promtool not found (install Debian's prometheus package)"; exit 1; \
		else \
			echo "SKIPPED the alert tests: promtool not found; 'sudo apt-get install prometheus', then make monitoring"; exit 0; \
		fi; \
	fi; \
	cd deploy/monitoring && $(PROMTOOL) check rules rules.yaml && $(PROMTOOL) test rules rules_test.yaml

# Each fuzz target for FUZZTIME; a finding is written to testdata/fuzz/ — commit it.
# Minimising a new input is capped at 10 s (the default 60 s stalls the run on big seeds).
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzScan$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s ./rewrite/
	$(GO) test -run '^$$' -fuzz '^FuzzRewrite$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s ./rewrite/
	$(GO) test -run '^$$' -fuzz '^FuzzYAMLScan$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s ./rewrite/
	$(GO) test -run '^$$' -fuzz '^FuzzYAMLSplice$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s ./rewrite/
	$(GO) test -run '^$$' -fuzz '^FuzzPrepareLike$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s ./rewrite/
	$(GO) test -run '^$$' -fuzz '^FuzzBackfill$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s ./rewrite/
	$(GO) test -run '^$$' -fuzz '^FuzzReferences$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s ./rewrite/
	$(GO) test -run '^$$' -fuzz '^FuzzProxyPut$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s ./proxy/

# The testcontainers tests (module integration/containers) against CONFSHIM_APISIX_IMAGE
# (default $(APISIX_IMAGE)). One line and success where no Docker engine answers. Where
# that image is neither here nor can be pulled, against the emulator's image
# (tools/image-test/standin-image.sh, on golang:$(GO_IMAGE_VERSION): make image-test makes
# a stand-in of it) with CONFSHIM_APISIX_EMULATED=1, which skips the gateway checks. Ryuk
# (its image cannot be pulled either) is off unless TESTCONTAINERS_RYUK_DISABLED says
# otherwise; inside a container (/.dockerenv) with a local engine the ports are reached
# on 127.0.0.1 (TESTCONTAINERS_HOST_OVERRIDE), where the tests publish them.
DOCKER       ?= docker
APISIX_IMAGE ?= apache/apisix:3.17.0-debian
EMULATOR_IMAGE ?= confshim/apisix-emulator:dev
GO_IMAGE_VERSION := $(shell sed -n 's/^ARG GO_VERSION=//p' Dockerfile)
integration:
	@if ! $(DOCKER) info >/dev/null 2>&1; then echo "SKIPPED make integration: no Docker engine answers ($(DOCKER) info)"; exit 0; fi; \
	image=$${CONFSHIM_APISIX_IMAGE:-$(APISIX_IMAGE)}; emulated=$${CONFSHIM_APISIX_EMULATED:-}; \
	if ! $(DOCKER) image inspect $$image >/dev/null 2>&1 && ! timeout 300 $(DOCKER) pull -q $$image >/dev/null 2>&1; then \
		echo "$$image cannot be had: against the emulator's image $(EMULATOR_IMAGE) (gateway checks skipped)"; \
		DOCKER=$(DOCKER) BASE=golang:$(GO_IMAGE_VERSION) GO=$(GO) tools/image-test/standin-image.sh apisix $(EMULATOR_IMAGE) || exit 1; \
		image=$(EMULATOR_IMAGE); emulated=1; \
	elif [ -n "$$($(DOCKER) image inspect -f '{{index .Config.Labels "org.confshim.standin"}}' $$image)" ]; then \
		echo "$$image is the emulator's stand-in (gateway checks skipped)"; emulated=1; \
	fi; \
	if [ -f /.dockerenv ] && case "$${DOCKER_HOST:-unix://}" in unix://*) true;; *) false;; esac; then \
		export TESTCONTAINERS_HOST_OVERRIDE=$${TESTCONTAINERS_HOST_OVERRIDE:-127.0.0.1}; fi; \
	cd integration/containers && CONFSHIM_APISIX_IMAGE=$$image CONFSHIM_APISIX_EMULATED=$$emulated \
		TESTCONTAINERS_RYUK_DISABLED=$${TESTCONTAINERS_RYUK_DISABLED:-true} $(GO) test -count=1 -v -run 'Container' ./...

# The image built with this Dockerfile and run, and deploy/compose run with stand-ins for
# APISIX and ADC, on a machine without a registry (tools/image-test/image-test.sh): as
# root it installs Debian's docker.io when missing and stops the dockerd it started;
# without root, or where no engine can start, it says why it skips (IMAGE_TEST=require: an
# engine that cannot start is an error).
image-test:
	@bash tools/image-test/image-test.sh

docker:
	docker build --build-arg VERSION=$(VERSION) -t confshim:$(VERSION) .

clean:
	rm -rf bin bench.txt
