# Quick start: `make demo` (live demo) and `make test` (whole suite). Both create .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.m2mwire-installed
# The Llama 3 tokenizer file ships inside this small wheel; --no-deps keeps its heavy
# dependency list (pydantic, Pillow, ...) out of the environment. See README "Tokenizers".
LLAMA_MODELS := llama-models==0.0.63

# Installs write to a log shown only on failure: pip and setuptools print dozens of warnings
# (e.g. pip's "Location ... is ignored" for a machine's extra-index-url that does not exist, or
# setuptools' "ext-modules is experimental") that tell the user nothing they can act on.
INSTALL_LOG := $(VENV)/install.log
PIP := $(BIN)/python -m pip install --disable-pip-version-check --no-warn-script-location
define quiet
	@$(1) >>$(INSTALL_LOG) 2>&1 || { cat $(INSTALL_LOG); echo "make: failed: $(1) (log: $(INSTALL_LOG))"; exit 1; }
endef

.PHONY: demo test check lint typecheck proto bench clean

$(STAMP): pyproject.toml
	@echo "installing m2mwire and its dependencies into $(VENV) (log: $(INSTALL_LOG))"
	@$(PYTHON) -m venv $(VENV)
	@: >$(INSTALL_LOG)
	$(call quiet,$(PIP) --upgrade pip)
	$(call quiet,$(PIP) -e '.[dev]')
	$(call quiet,$(PIP) --no-deps '$(LLAMA_MODELS)')
	@touch $(STAMP)

demo: $(STAMP)
	@$(BIN)/python -m m2mwire demo

test: $(STAMP)
	@$(BIN)/python -m pytest -q

# Static checks, apart from the tests: ruff lint, ruff format, mypy --strict.
check: $(STAMP)
	$(BIN)/ruff check m2mwire tests examples benchmarks
	$(BIN)/ruff format --check m2mwire tests examples benchmarks
	$(BIN)/mypy

lint: check

typecheck: $(STAMP)
	$(BIN)/mypy

# Regenerate the AVP protobuf module; tests/schemas/test_avp_proto.py fails when it is stale.
# The repository-relative proto path keeps its descriptor apart from the avp SDK's own avp.proto.
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. m2mwire/schemas/avp.proto

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
