# make demo: install, build an index of DATA (default: the shipped examples/data/cranfield, or
# ../shared/data/scifact when present), print its nDCG@10 and per-stage p50/p95/p99 (no Redis needed)
# make test: install everything (Python packages, redis-server, chromium) and run the whole suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DATA ?= $(if $(wildcard ../shared/data/scifact/corpus.jsonl),../shared/data/scifact,)
export HF_HUB_OFFLINE := 1

.PHONY: install demo test system-packages lint bench

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	# The CPU build of torch first: an unpinned torch pulled in by sentence-transformers
	# would be a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# The Redis server the tests start their own instances of, wrk (the overload test's load
# generator: a C client keeps its own queueing out of the measurement) and Debian's chromium
# (the console's browser tests drive it with Playwright; no browser is downloaded).
system-packages:
	@command -v redis-server >/dev/null && command -v wrk >/dev/null && \
	  command -v chromium >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q redis-server wrk chromium; }

demo: install
	$(BIN)/retrieval demo $(if $(DATA),--data $(DATA))

# -X faulthandler: a crash, even one while the interpreter exits after the last test, prints
# every thread's Python stack.
test: install system-packages
	$(BIN)/python -X faulthandler -m pytest -q

lint: install
	$(BIN)/ruff check retrieval indexes benchmarks tests
	$(BIN)/mypy retrieval indexes benchmarks

bench: install
	$(BIN)/python -m benchmarks.search $(if $(DATA),--data $(DATA))
