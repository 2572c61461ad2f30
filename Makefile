# Developer shortcuts; CI runs .ci/run.
PY ?= python

.PHONY: test lint typecheck bench bench-core bench-step bench-engine bench-sweep bench-startup bench-capacity

test:
	$(PY) -m pytest -q

lint:
	$(PY) -m ruff check .

typecheck:
	.ci/typecheck

bench: bench-core bench-step bench-engine bench-sweep bench-startup bench-capacity

bench-core:
	@uptime
	$(PY) benchmarks/bench_core.py --million

bench-step:
	$(PY) benchmarks/bench_step_cost.py

bench-engine:
	$(PY) benchmarks/bench_engine.py

bench-sweep:
	$(PY) benchmarks/bench_sweep.py

bench-startup:
	$(PY) benchmarks/bench_startup.py

bench-capacity:
	$(PY) benchmarks/bench_capacity.py
