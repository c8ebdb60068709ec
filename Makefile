# Muscle memory: each target runs one nox session (`nox -l` lists them all) or one halo command.
# Add a target as one line `name: ## what it does` plus its recipe; `make help` lists it.
NOX ?= nox
HALO ?= $(if $(wildcard .venv/bin/halo),.venv/bin/halo,halo)

# make train: a training job inside an image, in the foreground, removed when it ends.
CONFIG ?=
METHOD ?= sft
NPROC ?= 8
IMAGE ?= halo:blackwell
EXTRA ?=
# make train's credentials, as docker run's --env-file and a read-only ~/.aws, each only when
# it exists; set one empty to drop it (CI sets both empty). Only paths reach the command line.
ENV_FILE ?= .env
AWS_DIR ?= ~/.aws
# Where the tiers' and jobs' /scratch lives: $HALO_SCRATCH, else the large local volume that
# `halo paths scratch` finds (halo.scratch).
SCRATCH = $(or $(HALO_SCRATCH),$(shell $(HALO) paths scratch),$(error `$(HALO) paths scratch` failed))
# make push-public-*: where (default $HALO_REGISTRY, e.g. public.ecr.aws/ALIAS). They publish only
# what passed its catalog gate (signed test attestations); OVERRIDE_TESTS="WHO: WHY" overrides that,
# recorded in a signed attestation on the released digest.
REGISTRY ?=
OVERRIDE_TESTS ?=
PUSH_FLAGS = --verify-public $(if $(REGISTRY),--registry $(REGISTRY)) $(if $(OVERRIDE_TESTS),--override-tests '$(OVERRIDE_TESTS)')

.DEFAULT_GOAL := help
.PHONY: help lint fmt format precommit docs diagrams install clean lock lock-check pins-check fetch plan \
	build-cpu build-blackwell build-hopper build-vllm build-sglang build-all test test-toolchain \
	test-cpu test-gpu-core test-gpu-full test-rollout-vllm test-rollout-sglang patches example \
	bench ci-render train seed-hf-cache ecr-public-login push-public-all push-public-blackwell \
	push-public-hopper push-public-vllm push-public-sglang \
	test-gpu-vllm test-gpu-sglang serve-vllm device-check

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-22s %s\n", $$1, $$2}'

lint: ## ruff check + format check
	$(NOX) -s lint
fmt: ## apply ruff fixes and formatting
	$(NOX) -s fmt
format: ## the same as fmt
	$(NOX) -s fmt
precommit: ## lint + pins-check + ci-render --check: what to run before a commit
	$(NOX) -s precommit
docs: ## check the links and anchors of README.md and docs/
	$(NOX) -s docs
diagrams: ## draw docs/diagrams/ from the code: layering, images, tiers (CI byte-compares)
	$(NOX) -s diagrams
install: ## a development environment in .venv (halo editable + the dev tools)
	$(NOX) -s dev
clean: ## remove caches and HALO_SCRATCH test scratch; never checkpoints
	$(HALO) clean
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
# The rollout tiers on a GPU node, trainer container beside the server (the original Halo
# project's names). EFA=1: NCCL over the fabric; else plain sockets (NCCL_IB_DISABLE=1,
# NCCL_NET=Socket). SERVER_TIER=moe targets the MoE server config; TRAINER_CUDA_DEVICES=0,1
# picks the trainer's GPUs (default all).
GPU_TIER_FLAGS = --gpus $(if $(EFA),--fabric efa) \
	$(if $(TRAINER_CUDA_DEVICES),--cuda-devices $(TRAINER_CUDA_DEVICES)) \
	$(if $(SERVER_TIER),--server-tier $(SERVER_TIER))
test-gpu-vllm: ## rollout-vllm on GPUs (EFA=1, SERVER_TIER=moe, TRAINER_CUDA_DEVICES=0,1)
	$(NOX) -s test-rollout-vllm -- $(GPU_TIER_FLAGS)
test-gpu-sglang: ## rollout-sglang on GPUs (EFA=1, SERVER_TIER=moe, TRAINER_CUDA_DEVICES=0,1)
	$(NOX) -s test-rollout-sglang -- $(GPU_TIER_FLAGS)
serve-vllm: ## no GPU: the vLLM CPU server on this host (halo serve start vllm)
	$(NOX) -s serve-vllm
patches: ## verify patches against halo:cpu's environment
	$(NOX) -s patches
example: ## the main job: build halo:cpu and train the tiny SFT example in it
	$(NOX) -s example
bench: ## benchmarks with budgets (no-op build, pins/lock check, trainer vs TRL, GPU tokens/s + MFU)
	$(NOX) -s bench
device-check: ## bundle (<= 64 MiB) and print the one command for a lent GPU machine (docs/gpu.md)
	$(NOX) -s device-check -- $(or $(ARGS),--dry-run)
ci-render: ## regenerate the CI workflow from ci/matrix.yaml
	$(NOX) -s ci-render
train: ## train inside IMAGE: CONFIG=… [METHOD=sft NPROC=8 IMAGE=halo:blackwell EXTRA="--k=v …"]
	$(if $(CONFIG),,$(error make train: CONFIG=path/to/config.yaml is required))
	$(shell $(HALO) run --print --env-file '$(ENV_FILE)' --aws-dir '$(AWS_DIR)' $(IMAGE) -- halo launch $(METHOD) $(CONFIG) --nproc $(NPROC) $(if $(EXTRA),-- $(EXTRA)) || echo false)
seed-hf-cache: ## fill the HF cache the tiers mount (HALO_SCRATCH/hf) from LIST=models.toml [FROM=dir]
	$(if $(LIST),,$(error make seed-hf-cache: LIST=path/to/list.toml is required))
	$(HALO) hf-cache seed $(LIST) --cache $(SCRATCH)/hf/hub $(if $(FROM),--from $(FROM))
ecr-public-login: ## docker login to ECR Public (AWS CLI, us-east-1) for HALO_REGISTRY or REGISTRY=
	$(HALO) image ecr-public-login $(if $(REGISTRY),--registry $(REGISTRY))
push-public-all: ## publish every image built here, then check anonymous pulls
	$(HALO) image push --all $(PUSH_FLAGS)
push-public-blackwell: ## publish halo:blackwell (push by digest, then tag), check anonymous pulls
	$(HALO) image push blackwell $(PUSH_FLAGS)
push-public-hopper: ## publish halo:hopper, check anonymous pulls
	$(HALO) image push hopper $(PUSH_FLAGS)
push-public-vllm: ## publish vllm-server, check anonymous pulls
	$(HALO) image push vllm $(PUSH_FLAGS)
push-public-sglang: ## publish sglang-server, check anonymous pulls
	$(HALO) image push sglang $(PUSH_FLAGS)
# Jobs with a lifecycle (halo job): JOB= names one; CONFIG=, BACKEND=docker|slurm, VENV= start one.
JOB ?=
BACKEND ?= docker
KEEP ?= 2
.PHONY: job-start job-status job-logs job-stop job-restart job-clean test-slurm stack-install \
	image-export
job-start: ## start a detached job: CONFIG=… [BACKEND=docker|slurm VENV=dir EXTRA="--k=v …"]
	$(if $(CONFIG),,$(error make job-start: CONFIG=path/to/config.yaml is required))
	$(HALO) job start $(CONFIG) --method $(METHOD) --backend $(BACKEND) $(if $(VENV),--venv $(VENV)) $(if $(EXTRA),-- $(EXTRA))
job-status: ## every job's state (JOB= for one)
	$(HALO) job status $(JOB)
job-logs: ## a job's log: JOB=… [FOLLOW=1]
	$(HALO) job logs $(JOB) $(if $(FOLLOW),-f)
job-stop: ## graceful stop: SIGTERM, the emergency checkpoint within the grace period (JOB=…)
	$(HALO) job stop $(JOB)
job-restart: ## stop if running, start again: it resumes (JOB=…)
	$(HALO) job restart $(JOB)
job-clean: ## keep a job's newest KEEP checkpoints: dry run; FORCE=1 removes (JOB=… KEEP=2)
	$(HALO) job clean $(JOB) --keep $(KEEP) $(if $(FORCE),--force)
test-slurm: ## the Slurm end-to-end tests (start a cluster with ci/slurm-cluster.sh first)
	$(NOX) -s test-slurm
stack-install: ## the locked stack + halo as a venv, no Docker: SET=cpu PREFIX=dir
	$(HALO) stack install $(or $(SET),cpu) $(or $(PREFIX),$(error make stack-install: PREFIX=dir is required))
image-export: ## an image for Enroot or Apptainer: NAME=cpu FORMAT=sqsh|sif OUT=file
	$(HALO) image export $(or $(NAME),cpu) --format $(or $(FORMAT),sqsh) $(or $(OUT),$(error make image-export: OUT=file is required))
