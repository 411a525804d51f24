# Quick start: `make demo` (live demo) and `make test` (whole suite). Both create .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.m2mwire-installed
# The Llama 3 tokenizer file ships inside this small wheel; --no-deps keeps its heavy
# dependency list (pydantic, Pillow, ...) out of the environment. See README "Tokenizers".
LLAMA_MODELS := llama-models==0.0.63

.PHONY: demo test lint typecheck proto bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps '$(LLAMA_MODELS)'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m m2mwire demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check m2mwire tests examples benchmarks
	$(BIN)/ruff format --check m2mwire tests examples benchmarks
	$(BIN)/mypy

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
