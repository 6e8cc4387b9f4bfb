# gpufleet: the commands people and CI type. Everything runs from the project's .venv.
PY      ?= .venv/bin/python
STACK   ?= a100x4
TIER    ?= a100x8
PYTEST_ARGS ?=
ARGS    ?= --model gpt2 --tokens 1e9
GPUS_ARGS ?=

.PHONY: setup test plan cost compare size gpus lint format bench device-verify clean

setup: .venv/.installed  ## create .venv and install the pinned dependencies + this repo (editable)

.venv/.installed: requirements.txt requirements-dev.txt pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

test: setup  ## every test: unit, Pulumi mocks, sshd, moto, torchrun (starts and stops its own servers)
	$(PY) -m pytest $(PYTEST_ARGS)

plan: setup  ## offline: evaluate stacks/Pulumi.$(STACK).yaml under Pulumi's mocks; no account, no network
	$(PY) scripts/plan.py --stack $(STACK)

cost: setup  ## the bill for one stack before deploying it
	$(PY) scripts/cost.py --stack $(STACK)

compare: setup  ## a tier across providers, profiles and billing modes: table + chart
	$(PY) scripts/cost.py --compare $(TIER) --plot $(TIER)-cost.png

size: setup  ## which tier fits a training run and what the whole run costs: make size ARGS="--model llama-2-7b --tokens 1e9"
	$(PY) scripts/size.py $(ARGS)

gpus: setup  ## every GPU model and instance type in the catalog, with prices (GPUS_ARGS="--gpu A100")
	$(PY) scripts/gpus.py $(GPUS_ARGS)

lint: setup  ## ruff (lint + format check) and mypy
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy infra bootstrap scripts policy

format: setup
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

bench: setup  ## benchmarks that print numbers (ratios against a baseline measured in the same run)
	$(PY) scripts/bench_plan.py
	$(PY) scripts/bench_setup.py
	$(PY) scripts/bench_teardown.py

device-verify:  ## node-side verify-gpu checks directly on this machine's GPU (no SSH)
	bash scripts/device_verify.sh

clean:
	rm -rf .venv reports .pytest_cache .mypy_cache .ruff_cache
