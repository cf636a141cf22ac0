# Every target first sets up .venv and models/ (both idempotent), so any of them works as the
# first command on a fresh clone.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# A CPU build of torch: an unpinned torch pulls a multi-GB CUDA build on Linux. Triton runs
# chapter 20's kernels on the CPU in its interpreter; pinned like torch. A CUDA torch requires
# its own triton, so override both on a GPU machine: `make test TORCH=torch TRITON=triton`.
TORCH  ?= torch==2.13.0
TRITON ?= triton==3.9.0
# Test processes at once (pytest-xdist): one per usable CPU. Each worker runs its own in-process
# models on CPUs/JOBS threads (tests/conftest.py); the servers and engines the tests start pick
# their threads as they would alone. JOBS=0 runs the suite in this one process. A module's tests
# stay on one worker (loadfile): its module-scoped servers and process groups start once, not
# once per worker that happens to run one of its tests (on 2 cores: 427 s with load, 339 s).
# Not loadscope: it sends a class (the schedulers' TestRandomRun) to a worker apart from its
# module's functions, and a module's coverage test then runs all its random workloads again.
JOBS   ?= auto

.PHONY: check test book serve setup models mutate browser
check: setup
	$(PY) tools/steps.py check
	$(PY) tools/citations.py $(if $(OFFICIAL),--official $(OFFICIAL))

# The package is compiled before the suite: where PYTHONDONTWRITEBYTECODE is set (CI sets it),
# no process keeps its compilation, and each of the suite's hundreds of processes (servers,
# ranks, tokenizers) would compile the package again (about 0.1 s of CPU each).
test: setup browser
	$(PY) -m compileall -q python/minisgl tests
	$(PY) -m pytest -q -n $(JOBS) --dist loadfile --durations=15

book: setup
	$(PY) -m mkdocs build --strict

serve: setup
	$(PY) -m mkdocs serve

# Mutation testing of the bookkeeping modules (not part of CI: tens of minutes; see the script).
mutate: setup
	$(PY) tools/mutate.py $(MUTATE)

setup: $(VENV)/.installed $(VENV)/cuda/installed.txt models

# The CUDA 13.4 and 12.9 compilers that tests/test_cuda_toolchains.py compiles chapter 19's
# kernels with (257 MB of wheels, 640 MB installed), each in its own folder of .venv/cuda.
$(VENV)/cuda/installed.txt: $(VENV)/.installed tools/cuda_toolchains.py
	$(PY) tools/cuda_toolchains.py

# tests/test_animate.py measures chapter 0's player in headless Chromium (with a CJK font);
# installed only where it is missing, with apt-get where there is one (elsewhere: install
# Chromium yourself, or those tests say what is missing).
browser:
	command -v chromium >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || \
		{ apt-get update -q && apt-get install -y -q chromium fonts-noto-cjk; }

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" "$(TRITON)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

models: $(VENV)/.installed
	$(PY) tools/models.py
