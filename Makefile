# Developer shortcuts; CI runs .ci/run.
PY ?= python

.PHONY: test lint bench

test:
	$(PY) -m pytest -q

lint:
	$(PY) -m ruff check .

bench:
	$(PY) benchmarks/bench_step_cost.py
