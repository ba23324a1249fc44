SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

GO       ?= go
PKGS     := ./...
# The test suite's own timeout; CI allows far more, the suite needs a few minutes.
TEST_TIMEOUT ?= 12m
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := .tmp/bin/golangci-lint
# LangGraph.js for bench-compare (and its smoke run in test), pinned by
# bench/langgraph/package-lock.json; npm ci again when the lock changes.
LANGGRAPH_DIR := bench/langgraph
# The web console's frontend (console/README.md), pinned by
# console/web/package-lock.json; npm ci again when the lock changes. Its
# build, console/dist, is committed: go build never needs Node.
CONSOLE_DIR := console/web
# The clients' test environments (clients/README.md): the Python client in a
# virtual environment over Debian's binary packages (scripts/ensure-python.sh),
# the TypeScript client's packages pinned by clients/ts/package-lock.json.
PY_ENV := .tmp/py/bin/python
TS_CLIENT_DIR := clients/ts

.PHONY: failover python-env ts-client-deps console-screenshot help demo test test/race mutants mutants-index lint generate verify bench bench-compare scale bench-sched budget-compare tidy build clean image chart-test k8s-e2e console

help: ## Show this help
	@grep -hE '^[a-zA-Z/_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-11s\033[0m %s\n", $$1, $$2}'

demo: ## Run the demo: embedded Postgres, orchestrator + 3 workers, a sample fan-out, its result and audit
	@scripts/ensure-postgres.sh
	$(GO) run ./cmd/fanout dev --demo

build: ## Build the fanout binary into .tmp/bin
	$(GO) build -o .tmp/bin/fanout ./cmd/fanout

test: $(LANGGRAPH_DIR)/node_modules/.package-lock.json $(CONSOLE_DIR)/node_modules/.package-lock.json python-env ts-client-deps ## Vet and run every test with the race detector against a real PostgreSQL (and pinned npm MCP servers, axe-core for the console's browser test, the Python and TypeScript clients' suites), then bench-compare's, bench/scale's and bench/sched's smoke runs
	@scripts/ensure-postgres.sh --always
	@scripts/ensure-mcp-servers.sh
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'); exit 1; }
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)
	@$(MAKE) chart-test
	$(GO) build -o .tmp/bin/fanout ./cmd/fanout
	$(GO) run ./bench/compare --smoke --fanout .tmp/bin/fanout --langgraph $(LANGGRAPH_DIR)
	$(GO) run ./bench/scale --smoke --fanout .tmp/bin/fanout
	$(GO) run ./bench/sched --smoke --fanout .tmp/bin/fanout

chart-test: ## The Helm chart offline (deploy/, its own go.mod): render, lint, values schema, strict API types, rules, golden files
	cd deploy && $(GO) vet ./... && $(GO) vet -tags cluster ./... && $(GO) test -count=1 ./...

image: ## Build the container image with podman, reproducibly (deploy/image/Containerfile); prints its id
	scripts/image.sh

k8s-e2e: image ## The chart on a real cluster: API server + kwok nodes (tier 2), a real node with containerd running the image (tier 3); builds the Kubernetes binaries once per machine (.ci/k8s/build.sh); root
	bin=$$(.ci/k8s/build.sh) && cd deploy && $(GO) vet -tags cluster . && \
		FANOUT_K8S_BIN=$$bin $(GO) test -tags cluster -count=1 -timeout 30m -v -run 'TestCluster' .

failover: ## The failover tier: a primary and a sync (then async) standby, kill -9 of the primary under load; nodes cut off from PostgreSQL, 200 ms latency and loss (docs/operations.md#ha-postgresql); the whole log in .tmp/failover.log
	@scripts/ensure-postgres.sh
	@scripts/ensure-mcp-servers.sh
	@mkdir -p .tmp
	@rc=0; $(GO) test -race -tags failover -count=1 -timeout 10m -v \
		-run 'TestFailover|TestSlowWALFlush|TestOrchestratorCutOffFromPostgres|TestFleetCutOffLongerThanALease|TestDatabaseLatencyAndLoss' \
		./cmd/fanout > .tmp/failover.log 2>&1 || rc=$$?; \
		grep -E '^(=== RUN|--- |    --- |PASS|FAIL|ok)|_test\.go:[0-9]+: [^{ ]' .tmp/failover.log | grep -v '_test.go:[0-9]*: .*log (tail)'; exit $$rc

test/race: ## Run the suite 3 times with the race detector, to shake out flakes
	@scripts/ensure-postgres.sh
	$(GO) test -race -count=3 -timeout 30m $(PKGS)

mutants: ## Break each claimed invariant on purpose (mutants/*.mutant) and check a test catches it
	@scripts/ensure-postgres.sh
	@scripts/ensure-mcp-servers.sh
	scripts/mutants.sh

mutants-index: ## Regenerate docs/mutants-index.md from the mutants' headers
	$(GO) run ./scripts/mutate index $(wildcard mutants/*.mutant mutants/*.patch) >docs/mutants-index.md

lint: $(GOLANGCI_LINT) ## gofmt, go vet, golangci-lint (.golangci.yaml) and buf lint (pinned tools installed into .tmp/bin)
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'))" || { gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'); exit 1; }
	$(GO) vet $(PKGS)
	$(GO) vet -tags failover ./cmd/fanout
	$(GOLANGCI_LINT) run --build-tags failover $(PKGS)
	@echo "go run ./scripts/mutate check . mutants/*.mutant mutants/*.patch"
	@$(GO) run ./scripts/mutate check . $(wildcard mutants/*.mutant mutants/*.patch)
	scripts/generate.sh lint

# golangci-lint, pinned; rebuilt when the version changes (the stamp names it).
$(GOLANGCI_LINT): .tmp/bin/.golangci-lint-$(GOLANGCI_LINT_VERSION)
.tmp/bin/.golangci-lint-$(GOLANGCI_LINT_VERSION):
	@mkdir -p .tmp/bin
	GOBIN=$(CURDIR)/.tmp/bin $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	@rm -f .tmp/bin/.golangci-lint-* && touch $@

# What make generate writes (committed; make verify checks it is current).
GENERATED := proto store/internal/dbsqlc clients/python/src/fanout/v1 clients/python/src/fanout/_google clients/python/src/fanout/_rpc clients/ts/src/gen clients/ts/dist

generate: ## Regenerate the protobuf code (Go; the Python and TypeScript clients) and the store's query code (pinned buf, protoc-gen-go, protoc-gen-go-grpc, sqlc, Debian's protoc, protoc-gen-es; local plugins only)
	scripts/generate.sh generate

verify: generate lint ## Check that generated code is current and everything lints
	@git diff --exit-code -- $(GENERATED) || { echo "generated code is stale: run make generate and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- $(GENERATED))" || { git status --short -- $(GENERATED); echo "generated files are not committed: run make generate and commit"; exit 1; }
	@$(MAKE) console
	@git diff --exit-code -- console/dist $(CONSOLE_DIR)/src/gen || { echo "the console's build is stale: run make console and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- console/dist $(CONSOLE_DIR)/src/gen)" || { git status --short -- console/dist $(CONSOLE_DIR)/src/gen; echo "the console's build is not committed: run make console and commit"; exit 1; }

console-screenshot: $(CONSOLE_DIR)/node_modules/.package-lock.json ## Take docs/console.png (the README's picture) and docs/console-concurrency.png with the console's browser test
	@scripts/ensure-postgres.sh
	FANOUT_CONSOLE_SCREENSHOT=$(CURDIR)/docs/console.png FANOUT_CONCURRENCY_SCREENSHOT=$(CURDIR)/docs/console-concurrency.png $(GO) test -count=1 -run '^TestConsoleInABrowser$$' ./cmd/fanout/

console: $(CONSOLE_DIR)/node_modules/.package-lock.json | .tmp/bin/buf ## Build the web console into console/dist (committed): TypeScript from the protos (protoc-gen-es), type check, unit tests, bundle (esbuild-wasm)
	cd $(CONSOLE_DIR) && npm run --silent generate && npm run --silent typecheck && npm run --silent test && npm run --silent build

$(CONSOLE_DIR)/node_modules/.package-lock.json: $(CONSOLE_DIR)/package.json $(CONSOLE_DIR)/package-lock.json
	cd $(CONSOLE_DIR) && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error

python-env: ## The Python client's test environment .tmp/py (Debian's grpcio, protobuf, pytest; clients/python installed)
	@scripts/ensure-python.sh

ts-client-deps: $(TS_CLIENT_DIR)/node_modules/.package-lock.json ## The TypeScript client's pinned packages (npm ci in clients/ts)

$(TS_CLIENT_DIR)/node_modules/.package-lock.json: $(TS_CLIENT_DIR)/package.json $(TS_CLIENT_DIR)/package-lock.json
	cd $(TS_CLIENT_DIR) && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error

# buf for make console when make generate or lint has not installed it yet:
# the version scripts/generate.sh pins, with the stamp it checks.
.tmp/bin/buf:
	@mkdir -p .tmp/bin
	v=$$(sed -n 's/^BUF_VERSION=//p' scripts/generate.sh) && GOBIN=$(CURDIR)/.tmp/bin $(GO) install github.com/bufbuild/buf/cmd/buf@$$v && echo "$$v" >.tmp/bin/.buf.version

bench: ## Benchmarks: ledger hot account vs raw SQL, cancellation latency, fan-out overhead
	@scripts/ensure-postgres.sh
	$(GO) test -run '^$$' -bench . -benchtime 3s -timeout 30m ./store/ ./cmd/fanout/ ./subagent/...

bench-compare: $(LANGGRAPH_DIR)/node_modules/.package-lock.json ## fanout vs LangGraph.js in one run: overhead over the ideal at N = 10, 100, 1,000; then one tenant's 5,000 subagents in flight (bench/README.md)
	@scripts/ensure-postgres.sh --always
	$(GO) build -o .tmp/bin/fanout ./cmd/fanout
	$(GO) run ./bench/compare --fanout .tmp/bin/fanout --langgraph $(LANGGRAPH_DIR)

# SCALE_FLAGS picks and sizes the scenarios, e.g. SCALE_FLAGS="--scenario wide --tasks 1000".
SCALE_FLAGS ?=
scale: ## fanout at scale on one machine: 10,000 subagents at once, memory per subagent, 1,000 runs cancelled at once, a noisy tenant (bench/README.md; SCALE_FLAGS)
	@scripts/ensure-postgres.sh --always
	@scripts/ensure-mcp-servers.sh
	$(GO) build -o .tmp/bin/fanout ./cmd/fanout
	$(GO) run ./bench/scale --fanout .tmp/bin/fanout $(SCALE_FLAGS)

# SCHED_FLAGS picks modes and sizes, e.g. SCHED_FLAGS="--mode learn,flags" or "--runs 4 --tasks 20".
SCHED_FLAGS ?=
bench-sched: ## The scheduler: 20 runs of 50 tasks on one key against a 600 RPM / 200k TPM mock, fixed concurrency 16 vs unset: RPM/TPM against the ceiling, 429s (bench/README.md; SCHED_FLAGS)
	@scripts/ensure-postgres.sh --always
	$(GO) build -o .tmp/bin/fanout ./cmd/fanout
	$(GO) run ./bench/sched --fanout .tmp/bin/fanout $(SCHED_FLAGS)

$(LANGGRAPH_DIR)/node_modules/.package-lock.json: $(LANGGRAPH_DIR)/package.json $(LANGGRAPH_DIR)/package-lock.json
	cd $(LANGGRAPH_DIR) && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error

budget-compare: ## Admission by forecast vs greedy on the demo's spec at budgets 6k, 12k, 24k, 48k (docs/budget.md)
	FANOUT_BUDGET_COMPARE=1 $(GO) test -count=1 -run '^TestBudgetUseComparison$$' -v ./orchestrator/

tidy: ## go mod tidy, in the main module and in deploy/ (its own go.mod, which requires this one)
	$(GO) mod tidy
	cd deploy && $(GO) mod tidy

clean: ## Remove build output and the dev data dir
	rm -rf .tmp/bin/fanout .fanout
