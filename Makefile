# forge-course: `make lab` to learn, `make test` to check everything. Set-up runs once, when needed.
VENV     ?= .venv
BIN      := $(VENV)/bin
STAMP    := $(VENV)/.installed
LAB_PORT ?= 8888
LAB_ARGS ?=
# Tools that the tests start by name (nbgrader runs `alembic`, the lab test runs `jupyter`).
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: setup lab instructor-lab check test release release-graded grade bench mutate

setup: $(STAMP)

# PyTorch first, alone: a wheel already on this machine (pip's find-links) if there is one, else
# from the indexes, adding PyTorch's CPU-only index on Linux without an NVIDIA driver, whose
# 2.13.0+cpu (192 MB) pip prefers to PyPI's CUDA build (several GB with NVIDIA's libraries).
TORCH_CPU_INDEX := $(shell [ "$$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null \
	&& echo --extra-index-url https://download.pytorch.org/whl/cpu)

# The constraints file pins the CPU build of torch for this set-up only; the package asks for a range.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-deps --no-index -c constraints.txt torch 2>/dev/null \
		|| $(BIN)/python -m pip install --quiet --no-deps -c constraints.txt torch $(TORCH_CPU_INDEX)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# The Lab's settings live in forge_course/lab.py, so `make lab` and a pip-only set-up open the same Lab.
lab: setup
	$(BIN)/forge-course lab --port $(LAB_PORT) $(LAB_ARGS)

# The instructor's Lab: nbgrader's Formgrader and Create Assignment as well.
instructor-lab: setup
	$(BIN)/forge-course lab --instructor --port $(LAB_PORT) $(LAB_ARGS)

# The suite starts hundreds of Pythons (kernels, workers, ranks) that import the course: let
# them share its compiled bytecode, even where the machine turns writing it off (about 1.7 s
# less per process that imports the whole package, measured here).
WITH_BYTECODE := env -u PYTHONDONTWRITEBYTECODE

# While writing code: ruff and every test not marked slow (under 2 minutes on two cores).
check: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(WITH_BYTECODE) $(BIN)/pytest -n 2 --dist worksteal -m "not slow"

# Everything (23.8 minutes of pytest on two idle cores when last measured); the slowest are listed at the end.
test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(WITH_BYTECODE) $(BIN)/pytest -n 2 --dist worksteal --durations=30

release: setup
	$(BIN)/forge-course release

# The notebooks for a graded class (nbgrader or `forge-course grade`): build/graded/, whose
# question cells check only an answer's form, where notebooks/ tells a learner right from wrong.
release-graded: setup
	$(BIN)/forge-course release --graded

# Measures chapters, simulations, grading and set-up into benchmarks/RESULTS.md (BENCH_ARGS=--quick).
bench: setup
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

# Grades the sample class in autograder/examples/ into grading/examples/ (scores, feedback, CSV).
grade: setup
	FORGE_GRADING_DIR=$(CURDIR)/grading/examples $(BIN)/forge-course grade \
		--submitted autograder/examples --force

# Mutation-tests every exercise's check into benchmarks/VALIDITY.md (CHAPTERS="ch04 ch06" for
# some). Not part of `make test`: it runs each exercise's hidden tests once per mutant.
CHAPTERS ?=
mutate: setup
	nice -n 10 $(BIN)/python -m mutation $(CHAPTERS)
