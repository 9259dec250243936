# Two commands set everything up on a fresh machine (Python 3.11 + pip):
#   make train   # creates .venv, installs what training needs, trains DreamerV3 on Crafter
#   make test    # creates .venv, installs the dev extra too, runs the test suite
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: install install-dev train resume smoke test test-fast lint docs bench-learning gpu-wheels gpu-check-dry clean osmesa peers

# what training needs: the project and its dependencies (the extras stay extras)
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and exactly: the CPU wheel, never a multi-GB CUDA build by accident
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e .
	@touch $(STAMP)

# what the tests need besides: pytest, the trackers, the simulators (the dev extra)
$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev]"
	@touch $(DEV_STAMP)

install: $(STAMP)

install-dev: $(DEV_STAMP)

# Ctrl-C stops a run with a checkpoint, its resume line last on screen: the run is a
# terminal job of its own (DREAMER_TERMINAL_JOB: make does not get the Ctrl-C, which
# printed "make: *** [...] Interrupt" below that line) and its exit code 130 is taken
# as done (make printed "Error 130"); the extra the chosen env needs (dmc, atari) is
# installed first where it is missing (DREAMER_INSTALL_EXTRAS)
RUN = DREAMER_TERMINAL_JOB=1 DREAMER_INSTALL_EXTRAS=1 $(PY) -m dreamer.train
STOPPED = || [ $$? -eq 130 ]

train: $(STAMP)
	$(RUN) $(ARGS) $(STOPPED)

# the newest unfinished run of the default env (ARGS=env=<name>: of another), with its own config
resume: $(STAMP)
	$(RUN) run.resume=latest $(ARGS) $(STOPPED)

smoke: $(STAMP)
	$(RUN) experiment=smoke $(ARGS) $(STOPPED)

# MuJoCo's CPU renderer (env=dmc vision) needs Debian's libosmesa6
osmesa:
	@ldconfig -p | grep -q libOSMesa || { command -v apt-get >/dev/null && \
		{ apt-get update -qq && apt-get install -y -qq libosmesa6; } >/dev/null || echo "install libosmesa6 for env=dmc vision"; }

test: $(DEV_STAMP) osmesa
	# two workers, one file each at a time (module fixtures: a trained run, the SLURM
	# cluster; loadgroup split the SLURM tests over both workers, two clusters racing for
	# munged), files with long tests first, in the order tests/conftest.py gives them;
	# one torch thread per process: two workers' learners share two cores, and their
	# OpenMP threads would spin-wait against each other
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder $(ARGS)

# the inner loop: everything but the slow, SLURM and torchrun tests
test-fast: $(DEV_STAMP) osmesa
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not slow and not slurm and not distributed" $(ARGS)

# docs/configuration.md's key tables, made anew from the schema (tests/test_docs.py
# fails while they differ)
docs: $(STAMP)
	$(PY) -m dreamer.key_reference --write docs/configuration.md

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check dreamer tests benchmarks
	$(VENV)/bin/ruff format --check dreamer tests benchmarks

bench-learning: $(DEV_STAMP)
	$(PY) benchmarks/learning.py $(or $(ARGS),cartpole)

# .venv-peers/official for the side-by-side benchmarks: make peers OFFICIAL_SRC=<dreamerv3 checkout>
peers:
	$(PYTHON) benchmarks/peers/venvs.py --official-src "$(OFFICIAL_SRC)" --python $(PYTHON) $(ARGS)

# cp312 wheels the offline GPU machine installs (benchmarks/gpu_check.sh): the versions
# this venv resolves, less what that machine's image holds (torch 2.11, numpy, ...)
gpu-wheels: $(DEV_STAMP)
	$(PY) benchmarks/gpu_wheels.py build

gpu-check-dry: gpu-wheels
	bash benchmarks/gpu_check.sh --dry-run

clean:
	rm -rf $(VENV) .pytest_cache .whl
