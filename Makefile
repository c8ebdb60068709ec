# Muscle memory: each target runs one nox session (`nox -l` lists them all).
NOX ?= nox

.DEFAULT_GOAL := help
.PHONY: help lint fmt lock lock-check pins-check fetch plan build-cpu build-blackwell build-hopper \
	build-vllm build-sglang build-all test test-toolchain test-cpu test-gpu-core test-gpu-full \
	test-rollout-vllm test-rollout-sglang patches example bench ci-render

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-20s %s\n", $$1, $$2}'

lint: ## ruff check + format check
	$(NOX) -s lint
fmt: ## apply ruff fixes and formatting
	$(NOX) -s fmt
lock: ## re-resolve pin sets into pins/pylock.*.toml (SET=cpu for one)
	$(NOX) -s lock -- $(SET)
lock-check: ## fail on drift between inputs and locks
	$(NOX) -s lock-check -- $(SET)
pins-check: ## the cross-set invariants (offline)
	$(NOX) -s pins-check
fetch: ## download a set's artifacts into the store (SET=cpu)
	$(NOX) -s fetch -- $(or $(SET),cpu)
plan: ## print every image's build plan, without Docker
	$(NOX) -s plan
build-cpu: ## build halo:cpu
	$(NOX) -s build-cpu
build-blackwell: ## build halo:blackwell (SM100/SM103, FA4)
	$(NOX) -s build-blackwell
build-hopper: ## build halo:hopper (SM90, FA3)
	$(NOX) -s build-hopper
build-vllm: ## build vllm-server:0.26.0
	$(NOX) -s build-vllm
build-sglang: ## build sglang-server:0.5.17
	$(NOX) -s build-sglang
build-all: ## build every image in dependency order
	$(NOX) -s build-all
test: ## everything CI runs on a machine without a GPU
	$(NOX) -s ci
test-toolchain: ## toolchain tests on this host
	$(NOX) -s test-toolchain
test-cpu: ## the CPU tier inside halo:cpu
	$(NOX) -s test-cpu
test-gpu-core: ## the pull-request GPU gate inside halo:blackwell
	$(NOX) -s test-gpu-core
test-gpu-full: ## the many-GPU tier (by hand)
	$(NOX) -s test-gpu-full
test-rollout-vllm: ## rollout tests against a running vLLM server
	$(NOX) -s test-rollout-vllm
test-rollout-sglang: ## rollout tests against a running SGLang server
	$(NOX) -s test-rollout-sglang
patches: ## verify patches against halo:cpu's environment
	$(NOX) -s patches
example: ## the main job: build halo:cpu and train the tiny SFT example in it
	$(NOX) -s example
bench: ## benchmarks with budgets (no-op build, pins check, lock check, trainer)
	$(NOX) -s bench
ci-render: ## regenerate the CI workflow from ci/matrix.yaml
	$(NOX) -s ci-render
