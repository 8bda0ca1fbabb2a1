# gpumgr: two commands do everything on a fresh machine (Python 3.11+, gcc, make):
#   make demo   set up .venv, build the shim, run the whole system on a simulated node
#   make test   set up .venv, build the shim, run every test (Python, C shim, chart, and the real-Kubernetes
#               tier: needs Go 1.26 and etcd; the first run builds Kubernetes once into ~/.cache/gpumgr)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PROTOS := proto/deviceplugin.proto proto/vdevice.proto proto/dra.proto proto/pluginregistration.proto proto/drahealth.proto

.PHONY: all setup shim fake-nvml proto test test-python test-shim test-realk8s realk8s-bins lint demo bench clean

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
	$(BIN)/python -m pytest -q -p no:cacheprovider --ignore=tests/realk8s

# The pinned Kubernetes release and the fake CRI runtime, built once into ~/.cache/gpumgr/k8s-<version>/bin.
realk8s-bins: $(STAMP)
	$(BIN)/python -m tests.realk8s.build

# A real control plane and kubelet with gpumgr installed from the chart (tests/realk8s; skipped only without Go).
test-realk8s: $(STAMP) shim
	@if command -v go >/dev/null 2>&1; then $(MAKE) realk8s-bins; fi
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/realk8s

test-shim: $(STAMP) shim
	$(MAKE) -C vcuda test PYTHON=$(CURDIR)/$(BIN)/python

test: lint test-python test-shim test-realk8s

demo: $(STAMP) shim fake-nvml
	$(BIN)/gpumgr demo --once

bench: $(STAMP) shim
	$(BIN)/python -m tests.bench
	$(MAKE) -C vcuda bench PYTHON=$(CURDIR)/$(BIN)/python

clean:
	$(MAKE) -C vcuda clean
	$(MAKE) -C tests/fakes/libnvml clean
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
