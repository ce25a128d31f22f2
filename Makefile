# Coxswain developer entry points. `make help` lists them.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CARGO ?= cargo
COXSWAIN = $(CARGO) run --quiet -p coxswain-operator --bin coxswain --
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

##@ Build and generate

.PHONY: build
build: ## Build every crate and the coxswain binary
	$(CARGO) build --workspace

.PHONY: manifests
manifests: ## Regenerate config/crd/bases from the Rust CRD types
	$(COXSWAIN) crd --out-dir config/crd/bases

.PHONY: generate
generate: manifests bundle helm ## Regenerate every generated artifact

##@ OLM bundle

.PHONY: bundle
bundle: manifests ## Regenerate bundle/ and bundle.Dockerfile from config/ and the Rust CRD types
	$(COXSWAIN) bundle

.PHONY: bundle-check
bundle-check: ## Fail if bundle/ or bundle.Dockerfile differ from what `make bundle` writes
	$(COXSWAIN) bundle --check

.PHONY: bundle-validate
bundle-validate: ## Run operator-framework's bundle validators on bundle/ (zero errors and zero warnings)
	hack/olm/validate.sh bundle

##@ Helm chart

.PHONY: helm
helm: manifests ## Regenerate the Helm chart deploy/helm/coxswain from config/default
	$(COXSWAIN) helm

.PHONY: helm-check
helm-check: ## Fail if deploy/helm/coxswain differs from what `make helm` writes
	$(COXSWAIN) helm --check

.PHONY: helm-lint
helm-lint: ## `helm lint --strict` and `helm template` of the chart (helm built from its Go module by hack/helm)
	@helm_bin="$$(hack/helm/build.sh)"; \
	  "$$helm_bin" lint --strict deploy/helm/coxswain; \
	  "$$helm_bin" template coxswain deploy/helm/coxswain --namespace coxswain-system >/dev/null; \
	  echo "helm template: ok"

##@ Test

.PHONY: test
test: fmt-check clippy check-proxy-deps bundle-check bundle-validate helm-check helm-lint script-test k8s-bin ## fmt, clippy, the proxy's dependency guard, bundle and Helm chart drift, OLM validation, helm lint, the shell scripts' tests, then every test (unit and against a real local control plane)
	$(CARGO) test --workspace

.PHONY: script-test
script-test: ## Tests of the shell scripts CI trusts: test/conformance/check-report.sh on the committed reports and on broken copies
	test/conformance/check-report_test.sh

.PHONY: fuzz
fuzz: ## Property tests of the untrusted-input parsers with many cases (request targets, chunks, response heads, SNI, PROXY protocol, HTTP/2 frames and HPACK header blocks, annotations); bounded, part of CI
	PROPTEST_CASES=$${PROPTEST_CASES:-20000} $(CARGO) test -p coxswain-proxy --test properties --test http2_properties
	PROPTEST_CASES=$${PROPTEST_CASES:-20000} $(CARGO) test -p coxswain-operator --test annotation_properties

.PHONY: fmt
fmt: ## Format the code
	$(CARGO) fmt --all

.PHONY: fmt-check
fmt-check: ## Fail on unformatted code (skipped, loudly, where rustfmt is not installed)
	@if $(CARGO) fmt --version >/dev/null 2>&1; then \
	  $(CARGO) fmt --all -- --check; \
	else \
	  echo "!!!!! SKIPPED: rustfmt is not installed on this machine; formatting was NOT checked !!!!!"; \
	fi

.PHONY: clippy
clippy: ## Lint with clippy, warnings are errors (skipped, loudly, where clippy is not installed)
	@if $(CARGO) clippy --version >/dev/null 2>&1; then \
	  $(CARGO) clippy --workspace --all-targets -- -D warnings; \
	else \
	  echo "!!!!! SKIPPED: clippy is not installed on this machine; lints were NOT checked !!!!!"; \
	fi

.PHONY: check-proxy-deps
check-proxy-deps: ## Fail if the proxy crate's graph contains kube's client or runtime
	hack/check-proxy-deps.sh coxswain-proxy

##@ Local Kubernetes control plane (built from Go modules; no Docker needed)

.PHONY: k8s-bin
k8s-bin: ## Build (or reuse) etcd, kube-apiserver, kube-controller-manager and kubectl
	hack/cluster/build.sh >/dev/null

.PHONY: cluster-up
cluster-up: ## Start the local control plane and the test node (Pods run as processes), install the Gateway API and Coxswain CRDs
	$(CARGO) build --quiet -p coxswain-operator --bin coxswain -p coxswain-testenv --bin coxswain-node
	COXSWAIN_NODE_BIN="$(TARGET_DIR)/debug/coxswain-node" \
	COXSWAIN_NODE_IMAGES="coxswain=$(TARGET_DIR)/debug/coxswain" \
	hack/cluster/up.sh

.PHONY: cluster-down
cluster-down: ## Stop the local control plane and remove its state
	hack/cluster/down.sh

##@ OLM v0 on the local cluster (built from Go modules; hack/olm-runtime)

.PHONY: olm-up
olm-up: ## OLM's CRDs, olm and catalog operators (Pods on the test node) on `make cluster-up`'s cluster, and a catalog of bundle/ (CatalogSource olm/coxswain-catalog)
	$(CARGO) build --quiet -p coxswain-operator --bin coxswain -p coxswain-testenv --bin coxswain-node
	kubeconfig="$$(COXSWAIN_NODE_BIN="$(TARGET_DIR)/debug/coxswain-node" \
	  COXSWAIN_NODE_IMAGES="coxswain=$(TARGET_DIR)/debug/coxswain" hack/olm-runtime/up.sh)"; \
	hack/olm-runtime/catalog.sh "$$kubeconfig" bundle; \
	echo "OLM is up; subscribe as docs/install.md shows, with source: coxswain-catalog"

.PHONY: olm-e2e
olm-e2e: ## Real OLM installs Coxswain from a catalog, a GatewayClass with parametersRef serves, OLM upgrades it under traffic (0 failed requests), uninstall (root, test node)
	hack/olm-runtime/e2e.sh

##@ Run

.PHONY: demo
demo: ## Run Coxswain for real on a local cluster: installed from config/default as Pods, traffic through it
	hack/demo.sh

.PHONY: demo-metrics
demo-metrics: demo ## Every Grafana panel's query (config/monitoring) returns data on the demo cluster (Prometheus' engine, hack/promql)
	hack/monitoring/check-queries.sh

.PHONY: conformance
conformance: ## Gateway API conformance suite (GATEWAY-HTTP, GATEWAY-GRPC, GATEWAY-TLS) against Coxswain on a local cluster; report under test/conformance/reports/ (root, test node; ~4-5 min warm)
	test/conformance/run.sh

.PHONY: bench-propagation
# ROUTES: HTTPRoutes on the cluster before measuring (COXSWAIN_BENCH_EXISTING, default 1,000).
ROUTES ?=
bench-propagation: ## Route changes at ROUTES=N existing HTTPRoutes (default 1,000): create -> first 200 and update -> new answer (p50/p90/p99/max of 100), 1,000 at once -> last Accepted, 2->10->2 endpoint churn under a client, controller and proxy RSS (release; root, test node)
	$(CARGO) build --release -p coxswain-operator --bin coxswain --example propagation
	$(if $(ROUTES),COXSWAIN_BENCH_EXISTING=$(ROUTES)) COXSWAIN_BENCH_BIN=$(TARGET_DIR)/release/coxswain \
	  $(TARGET_DIR)/release/examples/propagation

.PHONY: bench-proxy
bench-proxy: ## coxswain vs nginx vs HAProxy: HTTP, HTTPS, new TLS connections, HTTP/2, header edits, POST bodies, latency at a fixed rate, idle memory (HTTP/1, TLS, HTTP/2) (installs wrk, h2load, nginx, HAProxy; not part of make test)
	hack/bench/proxy.sh

.PHONY: bench-memory
bench-memory: ## Proxy RSS with 1k/5k/20k HTTPRoutes and after 100 snapshot swaps, then lookup at 10 vs 100k routes (criterion ratio; not part of make test)
	hack/bench/memory.sh

.PHONY: bench
bench: ## Benchmarks (criterion): the compiler on 10k HTTPRoutes, route lookup at 10 and 100k routes, a snapshot applied at 3k and 20k hosts, HTTP/2 server work per request, h2 crate vs ours (the proxy against nginx and HAProxy: make bench-proxy)
	$(CARGO) bench -p coxswain-operator --bench compile
	$(CARGO) bench -p coxswain-proxy --bench lookup
	$(CARGO) bench -p coxswain-proxy --bench table_build
	$(CARGO) bench -p coxswain-proxy --bench http2
