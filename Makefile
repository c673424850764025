# Every target sets itself up: a fresh machine needs only Python 3.11 and make.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: setup demo test lint bench fuzz bench-policies bench-stress results figures images screenshot compose-demo swarm-demo docs clean help

help:
	@echo "make demo     run the main job (see README)"
	@echo "make test     set up and run the test suite"
	@echo "make bench    run the benchmarks and print figures"
	@echo "make fuzz     10,000 generated bad inputs at every entry point (minutes)"
	@echo "make bench-policies  every policy on 320 held-out random clusters and 20 of the paper's (30 min); summary into docs/data"
	@echo "make bench-stress    the same on the stress variants (docs/reference/scenarios.md); summary into docs/data"
	@echo "make results  rerun the paper's and the training scenarios (a minute), then render docs/results.md from docs/data"
	@echo "make figures  regenerate the figures in docs/img (Altair, rendered offline; the screenshot needs chromium)"
	@echo "make docs     regenerate docs/reference/cli.md and policies.md from the code"
	@echo "make compose-demo  the cluster demo on Docker Compose (docs/guide/compose.md)"
	@echo "make swarm-demo    the same on a single-node Docker Swarm stack"
	@echo "make images   start a Docker engine if needed and build the images (no registry)"
	@echo "make screenshot  regenerate docs/img/dashboard.png (the dashboard in headless Chromium)"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,workloads]'
	rm -f $(VENV)/.installed-*
	touch $@

setup: $(STAMP)

demo: setup
	$(BIN)/dqoes up --compare default,dqoes,learned --scenario paper-cluster-40 --seed 1 --time-scale 25

lint: setup
	$(BIN)/lint-imports
	$(BIN)/ruff check shared services dashboard experiments lab tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python -m bench

# Every entry point (targets, latency, decisions, states, objective hand-overs, control,
# scenario files, container labels) with 10,000 generated inputs each (bench/fuzz_inputs.py).
fuzz: setup
	$(BIN)/python -m bench fuzz

# The held-out and stress benchmarks take half an hour: they store their summaries in docs/data, and
# `make results` renders those without running them again (lab/results_page.py).
bench-policies: setup
	DQOES_BENCH_DATA=docs/data $(BIN)/python -m bench policies
	$(MAKE) results

bench-stress: setup
	DQOES_BENCH_DATA=docs/data $(BIN)/python -m bench stress
	$(MAKE) results

# docs/results.md, every number a table rendered from docs/data/*.json; the paper's and the training
# scenarios are simulated again first (about a minute, deterministic for the same code).
results: setup
	$(BIN)/python -m lab results simulate --seeds 1-5
	$(BIN)/python -m lab results render

# Every figure in docs/img: the dashboard's Altair figure functions rendered offline (vl-convert),
# from the recorded data in docs/, then the dashboard screenshot.
figures: setup
	$(BIN)/dqoes calibrate --from experiments/profiles.toml --plot docs/img/calibration.svg --update docs/guide/calibration.md
	$(MAKE) screenshot

# The README's picture of the dashboard: the browser test of the recorded DQoES-vs-default
# comparison, run in Debian's Chromium (apt-get install -y chromium), saves its screenshot there.
screenshot: setup
	DQOES_REQUIRE_BROWSER=1 DQOES_SCREENSHOT=docs/img/dashboard.png \
		$(BIN)/python -m pytest -q -p no:cacheprovider tests/e2e/test_dashboard_browser.py -k comparison

# Root: installs and starts dockerd when missing (see .ci/install-docker.sh).
images: setup
	bash .ci/install-docker.sh
	bash compose/images/build.sh

# Root on a fresh machine: installs the engine (images) and docker-compose when missing.
compose-demo: setup images
	bash .ci/install-compose.sh
	bash compose/demo.sh

swarm-demo: setup images
	bash compose/swarm-demo.sh

# The reference pages generated from the code (argparse parsers, the policy registry);
# the test suite fails while they are stale.
docs: setup
	PYTHONPATH=$(CURDIR) $(BIN)/python -m tools.refdocs

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
