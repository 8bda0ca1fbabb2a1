# gpumgr: two commands do everything on a fresh machine (Python 3.11+, gcc, make):
#   make demo   set up .venv, build the shim, run the whole system on a simulated node
#   make test   set up .venv, build the shim, run every test (Python, C shim, chart)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PROTOS := proto/deviceplugin.proto proto/vdevice.proto proto/dra.proto proto/pluginregistration.proto proto/drahealth.proto

.PHONY: all setup shim fake-nvml proto test test-python test-shim lint demo bench clean

all: setup shim

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,dev]'
	@touch $(STAMP)

setup: $(STAMP)

shim:
	$(MAKE) -C vcuda

# The fake libnvidia-ml.so.1 that simulates a whole node for the NVML backend's tests and `gpumgr demo --nvml`.
fake-nvml:
	$(MAKE) -C tests/fakes/libnvml

# Regenerate the protobuf/gRPC code from proto/ (committed; tests check it is current).
proto: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m grpc_tools.protoc -Igpumgr/pb=proto \
	  --python_out=. --grpc_python_out=. --mypy_out=. $(PROTOS)

lint: $(STAMP)
	$(BIN)/ruff check gpumgr tests
	$(BIN)/mypy

test-python: $(STAMP) shim fake-nvml
	$(BIN)/python -m pytest -q -p no:cacheprovider

test-shim: $(STAMP) shim
	$(MAKE) -C vcuda test PYTHON=$(CURDIR)/$(BIN)/python

test: lint test-python test-shim

demo: $(STAMP) shim fake-nvml
	$(BIN)/gpumgr demo --once

bench: $(STAMP) shim
	$(BIN)/python -m tests.bench
	$(MAKE) -C vcuda bench PYTHON=$(CURDIR)/$(BIN)/python

clean:
	$(MAKE) -C vcuda clean
	$(MAKE) -C tests/fakes/libnvml clean
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
