# Two commands on a fresh machine:  `make demo` (the main job) and `make test` (the test suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PKGS   := core gpu-hopper gpu-blackwell target-cutlass target-cute target-pallas amk
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): requirements/dev.txt $(foreach p,$(PKGS),packages/$(p)/pyproject.toml)
	@echo "==> creating $(VENV) with $$($(PYTHON) --version) and installing all packages (first run: a few minutes)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q -r requirements/dev.txt
	$(BIN)/python -m pip install -q --no-build-isolation $(foreach p,$(PKGS),-e packages/$(p))
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mosaic --version
	$(BIN)/mosaic plugins
	$(BIN)/mosaic gpus

# pytest exits 5 when it collects nothing; that is a failure here, as is any failed test.
test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check packages tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
