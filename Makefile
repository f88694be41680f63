# Every target sets up what it needs: on a fresh clone `make run` and `make test` just work.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast lint unit bench gpu-check gpu-wheels clean

install: $(STAMP)

# torch is pinned by constraints.txt so a machine without CUDA stays on the CPU build.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# The main job: the daemon in the background (kept running when the dashboard closes), then the
# dashboard on it. With no NVIDIA driver both still run, sampling the host.
run: $(STAMP)
	$(BIN)/gpuwarden up
	$(BIN)/gpuwarden tui

lint: $(STAMP)
	$(BIN)/ruff check gpuwarden tests bench examples gpucheck
	$(BIN)/ruff format --check gpuwarden tests bench examples gpucheck
	$(BIN)/mypy
	$(BIN)/lint-imports

# First the `serial` tests alone, collecting only the modules that mark any (collecting the
# whole suite costs a quarter of a minute), then the rest on three workers, a test module per
# worker at a time so module fixtures are built once. Three on two cores: many tests wait on a
# daemon or a child process, and a third worker fills those waits (8.5 against 9.5 minutes). The
# parallel run goes last so the run ends with the suite's real summary line.
JOBS ?= 3
SERIAL_MODULES = $(shell grep -rl --include='test_*.py' 'mark\.serial' tests)
# The tests start hundreds of Python processes (daemons, runners, CLI calls) and every xdist
# worker collects the whole suite: compiled modules are cached, as Python does unless told not
# to (an inherited PYTHONDONTWRITEBYTECODE doubles collection, about 10 s of CPU per worker).
unit: export PYTHONDONTWRITEBYTECODE :=
unit: $(STAMP)
	$(if $(SERIAL_MODULES),$(BIN)/pytest -q -p no:xdist -m serial $(SERIAL_MODULES))
	$(BIN)/pytest -q -n $(JOBS) --dist loadfile -m "not serial"

test: lint unit

# The inner loop while changing code: every test not marked `slow` (those run real training and
# inference, a Slurm, an sshd, several machines), no lint. CI runs the whole `make test`. When
# every serial test is also slow, pytest collects none and says so with exit status 5: not a failure.
test-fast: export PYTHONDONTWRITEBYTECODE :=
test-fast: $(STAMP)
	$(if $(SERIAL_MODULES),$(BIN)/pytest -q -p no:xdist -m "serial and not slow" $(SERIAL_MODULES) || [ $$? -eq 5 ])
	$(BIN)/pytest -q -n $(JOBS) --dist loadfile -m "not serial and not slow"

bench: $(STAMP)
	$(BIN)/python -m bench

# The check on the hardware gpuwarden is for (docs/gpu-check.md). On an NVIDIA machine without a
# package registry: first, where pip reaches PyPI, `make gpu-wheels`; carry .gpu-wheels/ along;
# there, `make gpu-check` installs them into .gpu-site/ (offline) and runs every step, or those
# named: `make gpu-check STEPS=nvml-truth,nvml-cost`. Without a GPU every step is skipped.
# Modules are compiled first and cached, as an install would have them (a GPU image may set
# PYTHONDONTWRITEBYTECODE): start-up figures then measure gpuwarden, not the bytecode compiler.
# The check runs inside BUDGET seconds from here (one GPU window, the wheels included): first the
# steps that have not passed for the current code, as many as fit; the next window goes on.
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
BUDGET ?= 540
gpu-check: export PYTHONDONTWRITEBYTECODE :=
gpu-check: export GPUCHECK_STARTED := $(shell date +%s)
gpu-check:
	$(GPU_PYTHON) -m gpucheck.wheels install
	$(GPU_PYTHON) -m compileall -q gpuwarden gpucheck bench tests
	PYTHONPATH=$(CURDIR)/.gpu-site:$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} \
		$(GPU_PYTHON) -m gpucheck --budget $(BUDGET) $(if $(STEPS),--steps $(STEPS)) $(if $(AGAIN),--again)

gpu-wheels: $(STAMP)
	$(BIN)/python -m gpucheck.wheels download

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
