# gpufleet: the commands people and CI type. Everything runs from the project's .venv.
PY      ?= .venv/bin/python
STACK   ?= a100x4
TIER    ?= a100x8
PYTEST_ARGS ?=
ARGS    ?= --model gpt2 --tokens 1e9
GPUS_ARGS ?=
WHERE_ARGS ?= $(TIER)

.PHONY: setup fc-wheels help system-packages test test-fast plan preflight up reserve cost refresh-prices compare size gpus where lint format bench device-verify clean

# The wheels of each cloud function built from wheels (a cloud folder's reaper.py WHEELS,
# pinned by its function-requirements.txt), for that function's runtime, not for this venv:
# its zip is built from them (build/wheels/<cloud>).
FC_WHEELS = build/wheels
FC_LOCK   = $(wildcard infra/clouds/*/function-requirements.txt)

setup: .venv/.installed fc-wheels  ## .venv (pinned, this repo editable) and fc-wheels

fc-wheels: $(FC_WHEELS)/.complete  ## cloud function wheels for their runtimes, from PyPI

help:  ## this list
	@grep -E '^[a-zA-Z_-]+:.*## ' $(firstword $(MAKEFILE_LIST)) | \
	  sed -e 's/:.*## /\t/' | awk -F '\t' '{ printf "  make %-16s %s\n", $$1, $$2 }'

system-packages:  ## system-packages.txt: install (root) or print the command
	sh scripts/install_system_packages.sh

# pip compiles every file it installs, one at a time, 10,000 of them in provider SDK services
# nothing here imports: the venv is installed uncompiled, then compiled on every core but for
# those services (scripts/compile_venv.py). Measured on 2 cores: 284 s -> 84 + 63 s.
.venv/.installed: requirements.txt requirements-dev.txt pyproject.toml scripts/compile_venv.py
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -r requirements-dev.txt
	$(PY) -m pip install -q --no-compile --no-deps -e .
	$(PY) scripts/compile_venv.py
	touch $@

# Needs the venv but never rebuilds it (`make setup` builds the venv first, then this).
$(FC_WHEELS)/.complete: $(FC_LOCK) scripts/fc_wheels.py
	@test -x $(PY) || { echo "make fc-wheels: no $(PY) yet: run make setup" >&2; exit 2; }
	$(PY) scripts/fc_wheels.py --into $(FC_WHEELS)
	touch $@

# pytest's exit status 5 means "no test selected" (a PYTEST_ARGS filter that matches nothing):
# said, and not a failure.
PYTEST_RC = rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no test selected (exit 5)"; rc=0; fi; exit $$rc

# pytest-xdist workers, three on these 2 cores: the suite waits about as much as it computes
# (SSH round trips, torchrun start-ups, polling a bucket), so a third worker computes while
# two wait (the same suite on 2 quiet cores: 621 s in two workers, 553 s in three;
# docs/testing.md has the figures). A test file stays on one worker (--dist loadfile), so
# its module fixtures (a fleet of sshd nodes, a moto server) start once.
# PYTEST_WORKERS=0 runs the suite in this one process.
PYTEST_WORKERS ?= 3
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

test: system-packages setup  ## every test (system packages, .venv, own sshd/moto)
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS); $(PYTEST_RC)

test-fast: setup  ## no integration, no slow tests (day to day)
	$(PY) -m pytest -m "not integration and not slow" $(XDIST) $(PYTEST_ARGS); $(PYTEST_RC)

plan: setup  ## STACK=a100x4: offline plan under Pulumi's mocks
	$(PY) scripts/plan.py --stack $(STACK)

preflight: setup  ## STACK=a100x4 [PREFLIGHT_ARGS=--request-quota]: account
	$(PY) scripts/preflight.py --stack $(STACK) $(PREFLIGHT_ARGS)

up: setup  ## STACK=a100x8: deploy, failing over when a zone is full
	$(PY) scripts/up.py --stack $(STACK) $(UP_ARGS)

cost: setup  ## STACK=a100x4: the bill before deploying
	$(PY) scripts/cost.py --stack $(STACK)

refresh-prices: setup  ## [CLOUD=azure]: catalog prices from the price APIs
	$(PY) scripts/refresh_prices.py $(if $(CLOUD),--cloud $(CLOUD)) $(REFRESH_ARGS)

compare: setup  ## TIER=a100x8 across clouds and billing: table + chart
	$(PY) scripts/cost.py --compare $(TIER) --plot $(TIER)-cost.png

size: setup  ## which tier fits a run, what it all costs (ARGS="...")
	$(PY) scripts/size.py $(ARGS)

gpus: setup  ## every GPU model and instance type, priced (GPUS_ARGS=)
	$(PY) scripts/gpus.py $(GPUS_ARGS)

where: setup  ## where a tier is offered, priced (WHERE_ARGS=a100x8)
	$(PY) scripts/where.py $(WHERE_ARGS)

reserve: setup  ## Capacity Blocks for ML, priced (RESERVE_ARGS=...)
	$(PY) scripts/reserve.py $(RESERVE_ARGS)

# mypy's worker processes: a cold run (a clean clone, as in CI) checks 5,600 modules (SDK
# services, torch, moto): 97 s in one process, 61 s in two on 2 cores; a warm run takes
# 3 s either way.
MYPY_WORKERS ?= 2

lint: setup  ## ruff (lint + format check) and mypy
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy -n $(MYPY_WORKERS) infra bootstrap scripts policy gpufleet_node

format: setup  ## ruff format + ruff check --fix
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

bench: setup  ## benchmarks against a same-run baseline; fails on a miss
	$(PY) scripts/bench_digest.py
	$(PY) scripts/bench_plan.py
	$(PY) scripts/bench_setup.py
	$(PY) scripts/bench_teardown.py
	$(PY) scripts/bench_train.py

device-verify:  ## verify-gpu's node checks on this machine's GPU
	bash scripts/device_verify.sh

clean:  ## remove .venv, build/wheels and the caches
	rm -rf .venv $(FC_WHEELS) reports .pytest_cache .mypy_cache .ruff_cache
