# ctr-lambda: `make demo` to see it run, `make test` to check it. `make help` lists the rest.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
CTR := $(VENV)/bin/ctr
export RUN_DIR ?= $(CURDIR)/run

.PHONY: help setup seaweedfs python-archive test-host demo demo-cluster demo-down s3-up s3-down airflow-up airflow-down postgres-up postgres-down test test-unit test-faults docs docs-serve reference lint format kafka-up kafka-down kafka-status bench bench-table soak lock clean dashboard dashboard-screenshot demo-screenshot

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

setup:  ## create .venv with the pinned dependency set (idempotent)
	@bash infra/setup.sh

seaweedfs:  ## build the local S3 server (SeaweedFS) once from the Go module proxy into ~/.cache/ctr-lambda/bin: needs Go >= 1.26, about 10 minutes the first time (make test, make demo-cluster, make s3-up)
	@bash infra/seaweedfs.sh > /dev/null

python-archive: setup  ## the packed Python environment a Spark cluster's executors run: dist/ctr-lambda-python.tar.gz (the project's wheel, its dependencies), shipped by every job on spark://, yarn or k8s://
	@$(PY) -m infra.python_archive

test-host: setup  ## a shell (or CMD="...") on a fresh test host (root): its own /tmp and /home/ctr, the checkout read-only; BARE=1: no checkout, no .venv
	@$(PY) -m infra.hosts $(if $(BARE),--bare) -- $(or $(CMD),bash)

demo: setup  ## everything in the background: broker, archiver, speed, Airflow, API + dashboard, traffic
	@bash infra/demo.sh

demo-cluster: setup seaweedfs  ## make demo PROFILE=cluster: 3 brokers, the lake on the local S3 server, a Spark standalone cluster, Airflow on PostgreSQL
	@PROFILE=cluster bash infra/demo.sh

demo-down:  ## stop every process `make demo` started, by pid (traffic first, jobs drain)
	@bash infra/demo-down.sh

test: setup seaweedfs  ## build the docs site (strict), then run every tier: unit, integration (Spark, Kafka), e2e (browser, Airflow, clusters)
	@$(MAKE) --no-print-directory docs
	@bash infra/system-packages.sh chromium postgresql haproxy
	@bash infra/prometheus.sh > /dev/null
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: setup  ## the unit tier only (no JVM, broker or browser): a pure change checked in seconds
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-faults: setup  ## the fault tests only, each fault repeated CTR_FAULT_ROUNDS times (default 5)
#: How many times the fault tests repeat each fault (make test-faults: 5).
	CTR_FAULT_ROUNDS=$${CTR_FAULT_ROUNDS:-5} $(PY) -m pytest -m faults $(PYTEST_ARGS)

docs: setup  ## build the docs site into site/ (strict: a warning, a broken link or a stale reference page fails it)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	$(PY) -m reference.links site

docs-serve: reference  ## serve the docs site on 127.0.0.1:8001 with live reload of docs/
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8001

reference: setup  ## rewrite docs/reference/ from the code (settings, CLI, OpenAPI, SQL allow-list, tables)
	$(PY) -m reference

lint: setup  ## ruff format --check, ruff check, mypy --strict, the dependency direction
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy .
	$(VENV)/bin/lint-imports --no-cache

format: setup  ## apply ruff formatting and fixes
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

airflow-up: setup  ## Airflow (scheduler, DAG processor, triggerer, API server) on 127.0.0.1:8080, SQLite under run/ (AIRFLOW_DB=postgres: PostgreSQL), DAGs unpaused
	@bash infra/airflow-up.sh && echo "airflow: stop with make airflow-down"

airflow-down:  ## stop Airflow (make airflow-up's process group)
	@bash infra/airflow-down.sh

postgres-up:  ## a private PostgreSQL for Airflow on 127.0.0.1:55432 (PG_PORT), data under run/postgres, settings in run/postgres/env
	@bash infra/postgres.sh up

postgres-down:  ## stop it (its data stays)
	@bash infra/postgres.sh down

s3-up: setup seaweedfs  ## the local S3 server (SeaweedFS) on 127.0.0.1:8333 (CTR_S3_PORT), bucket ctr-lake, data under run/s3, settings in run/s3/env
	@$(CTR) s3 up

s3-down:  ## stop it (its data stays)
	@$(CTR) s3 down

kafka-up: setup  ## start the embedded broker (local config) and create the topics
	@$(CTR) kafka up

kafka-down:  ## stop the embedded broker
	@if [[ -x $(CTR) ]]; then $(CTR) kafka down; else echo "nothing to stop (no .venv)"; fi

kafka-status: setup  ## brokers, topics, partitions, offsets
	@$(CTR) kafka status

bench: setup  ## run the benchmarks, write the results table (BENCH_ARGS="ingest" for one)
	@bash infra/system-packages.sh kcat wrk haproxy
	$(PY) -m bench $(BENCH_ARGS)

soak: setup  ## the platform under traffic for SOAK_MINUTES (60) at SOAK_RATE (1000/s); CHAOS=1 kills components; report in RUN_DIR/soak
	$(PY) -m infra.soak

bench-table: setup  ## rebuild bench/results/RESULTS.md and docs/performance.md's table from the last results
	$(PY) -m bench.report

dashboard:  ## re-vendor Chart.js and Swagger UI from npm (after changing dashboard/package.json)
	@bash infra/build-dashboard.sh

dashboard-screenshot: setup  ## run the dashboard browser test and refresh docs/dashboard.png
	@bash infra/system-packages.sh chromium
	CTR_DASHBOARD_SCREENSHOT=docs/dashboard.png $(PY) -m pytest tests/e2e/test_dashboard.py

demo-screenshot: setup  ## screenshots of the running demo's dashboard into docs/ (overview, filters, comparison, table)
	@bash infra/system-packages.sh chromium
	@$(PY) -m infra.demo_screenshot docs

lock:  ## re-resolve constraints.txt from pyproject.toml in a scratch venv
	@bash infra/lock.sh

clean:  ## remove run state (broker logs, pid files); the venv stays
	rm -rf $(RUN_DIR)
