# turingbox — the two commands most people need: `make up` and `make test`.
SHELL := /bin/bash
# `make dev` builds a virtual environment (Debian's python3 refuses `pip install` outside one, PEP 668);
# every target uses its interpreter once it exists. PYTHON=... picks another one.
VENV ?= .venv
BOOTSTRAP_PYTHON ?= python3
PYTHON ?= $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,$(BOOTSTRAP_PYTHON))
# ... and its console scripts (hadolint, yamllint, kubectl, turingbox) for the tests' subprocesses
export PATH := $(abspath $(VENV))/bin:$(PATH)
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= turingbox:$(VERSION)
BASE_IMAGE ?= nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04
EXTRA_CA_CERT ?=
# Compose v2 only: compose.cpu.yaml needs it (`!reset`), and tools/up-check.sh says so when it is missing
COMPOSE ?= docker compose
# what `make dev` installs from: tools/ci/test-setup.sh re-runs it when these change (.venv/.turingbox-dev-key)
DEV_INPUTS := pyproject.toml plugin/pyproject.toml requirements/structured-output.txt
PYTEST ?= $(PYTHON) -m pytest
# pytest exit 5 means "no tests collected": that is a failure here, never a silent pass.
run_pytest = $(PYTEST) $(1); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

.PHONY: help dev up down logs plan image test test-all test-setup test-unit test-deploy test-image test-reliability lint \
        warmup-cache bake bench-decode bench-prefill bench-startup verify-sm75 clean distclean

help: ## this list
	@awk -F ':.*## ' '/^[A-Za-z0-9_.-]+:.*## / {printf "%-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

dev: ## a virtual environment in .venv with everything for development (appliance, plugin, test tools), editable
	@[ -x $(VENV)/bin/python ] || $(BOOTSTRAP_PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -e ./plugin -e '.[dev]'
	$(VENV)/bin/python -m pip install --no-deps -r requirements/structured-output.txt
	@cat $(DEV_INPUTS) | sha256sum | cut -c1-16 >$(VENV)/.turingbox-dev-key
	@echo "installed in $(VENV): make test uses it; for a shell, source $(VENV)/bin/activate"

up: ## build the image if needed and serve (the demo model when no model is given); checks Docker, Compose v2 and the GPU first
	@tools/up-check.sh up
	@docker image inspect $(IMAGE) >/dev/null 2>&1 || $(MAKE) image
	TURINGBOX_IMAGE=$(IMAGE) $(COMPOSE) up -d
	@echo "turingbox is starting: curl -s localhost:$${TURINGBOX_PORT:-8000}/health/ready"

down: ## stop and remove the service (caches stay in their volume)
	@tools/up-check.sh down
	$(COMPOSE) down

logs: ## follow the service log
	@tools/up-check.sh logs
	$(COMPOSE) logs -f

plan: ## print the plan for this machine's GPUs (GPUS_JSON=file to simulate)
	$(PYTHON) -m turingbox plan $(if $(GPUS_JSON),--gpus-json $(GPUS_JSON)) $(if $(MODEL),--model $(MODEL))

image: ## build the appliance image (BASE_IMAGE=..., EXTRA_CA_CERT=path for TLS-intercepting proxies)
	tools/ci/docker-build.sh -t $(IMAGE) --build-arg BASE_IMAGE=$(BASE_IMAGE) \
	  $(if $(EXTRA_CA_CERT),--build-arg EXTRA_CA_CERT_B64=$$(base64 -w0 $(EXTRA_CA_CERT))) .

# What `make test` leaves out: a GPU (the GPU machine runs those), and the 60 s load test unless SLOW=1.
TEST_MARKERS = not gpu$(if $(SLOW),, and not slow)

test: test-setup ## every test in one pytest run, after test-setup: CPU, deploy, the image (built once), reliability (SLOW=1 for the 60 s load)
	@# a sub-make: it reads the venv test-setup may just have built (PYTHON is chosen when make starts)
	@$(MAKE) --no-print-directory test-all

test-all: ## what `make test` runs once test-setup is done: one pytest run over tests/
	@$(call run_pytest,tests -m "$(TEST_MARKERS)")

test-setup: ## what `make test` needs, each step skipped when done: apt tools, the venv (make dev), package sources in .cache/, a Docker engine with Compose v2 and buildx, the stand-in base image (root on Debian 12)
	@VENV=$(VENV) DEV_INPUTS="$(DEV_INPUTS)" tools/ci/test-setup.sh

# Parts of `make test` for development (each one pytest run; markers, not folders, say what a test needs):
test-unit: ## the tests that need no GPU, no Docker and little time (planner, sidecar, caches, plugin, ...)
	@$(call run_pytest,tests -m "not docker and not gpu and not slow" --ignore=tests/reliability --ignore=tests/deploy)

test-deploy: ## kustomize base + components rendered and validated (vendored CRD schemas), dashboard build, alert rules (promtool), metric names
	@$(call run_pytest,tests/deploy)

test-image: ## every test that needs Docker: the image built on a local stand-in base and smoke-tested without a GPU, bake, two containers on one cache
	@$(call run_pytest,tests -m "docker and $(TEST_MARKERS)")

test-reliability: ## load, faults, bad input and security tests of the sidecar (no GPU; SLOW=1 for the full 60 s load)
	@$(call run_pytest,tests/reliability -m "$(TEST_MARKERS)")

lint: ## hadolint, yamllint, kubernetes-validate
	hadolint Dockerfile
	yamllint -s compose.yaml compose.cpu.yaml deploy/kubernetes deploy/overlays deploy/prometheus
	kubernetes-validate deploy/kubernetes/*.yaml

warmup-cache: ## seed the cache volume by running the image on this host's GPUs (Docker SDK)
	$(PYTHON) -m turingbox_warmup.seed_volume --image $(IMAGE)

bake: ## an image with a seeded cache entry inside (FROM_VOLUME=... or FROM_DIR=...)
	$(PYTHON) -m turingbox_warmup.bake --image $(IMAGE) $(if $(FROM_VOLUME),--from-volume $(FROM_VOLUME)) $(if $(FROM_DIR),--from-dir $(FROM_DIR)) $(if $(GPUS_JSON),--gpus-json $(GPUS_JSON))

# The plugin's benches read their key from TBPLUGIN_API_KEY, never the appliance's TURINGBOX_API_KEY: hand it on.
BENCH_KEY = TBPLUGIN_API_KEY="$${TBPLUGIN_API_KEY:-$${TURINGBOX_API_KEY:-}}"

bench-decode: ## decode tok/s against a running server (URL=http://localhost:8000)
	$(BENCH_KEY) $(PYTHON) -m turingbox bench decode --url $${URL:-http://localhost:8000} --json

bench-prefill: ## TTFT vs prompt length regression against a running server, JSON + PNG
	$(BENCH_KEY) $(PYTHON) -m turingbox bench prefill --url $${URL:-http://localhost:8000} --json --plot docs/img/prefill.png

bench-startup: ## GPU host: plain vllm serve vs turingbox serve; PHASES="empty seed seeded warm report"
	for p in $${PHASES:-empty seed seeded warm report}; do bash bench/startup.sh $$p || exit 1; done

verify-sm75: ## compile every plugin kernel for sm_75 without a GPU; registers, shared memory, spills
	$(PYTHON) -m turingbox verify --compile-only --arch 7.5 --json

clean: ## remove build products (keeps the venv and the package sources in .cache/: make distclean removes them too)
	rm -rf build dist *.egg-info plugin/build plugin/*.egg-info .pytest_cache

distclean: clean ## clean, and remove the venv and .cache/ (the next make test-setup rebuilds them)
	rm -rf $(VENV) .cache
