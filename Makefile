# `make run` and `make test` each create .venv and install what they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# Use the local CPU torch wheel where pip's config points at one (pinned to its version);
# otherwise PyPI's default build, which runs on CPU too.
TORCH_WHEEL := $(firstword $(wildcard /opt/wheels/torch-*.whl))
TORCH_REQ   := $(if $(TORCH_WHEEL),torch==$(word 2,$(subst -, ,$(notdir $(TORCH_WHEEL)))),torch)

.PHONY: run test venv tools unit integration e2e lint control-plane bench bench-components clean

$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) and installing modelplex with its dev and replica extras"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q '$(TORCH_REQ)' -e '.[replica,dev]'
	touch $(STAMP)

venv: $(STAMP)

# promtool (tests check the metrics' format with it): from Debian's prometheus package, extracted
# into the venv, so no Prometheus service gets installed or started.
$(VENV)/bin/promtool: | $(STAMP)
	@echo "==> promtool from Debian's prometheus package"
	rm -rf $(VENV)/.deb && mkdir -p $(VENV)/.deb
	cd $(VENV)/.deb && { apt-get download -q prometheus || { apt-get update -qq && apt-get download -q prometheus; }; } \
	  && dpkg-deb -x prometheus_*.deb root && cp root/usr/bin/promtool ../bin/promtool
	rm -rf $(VENV)/.deb

tools: $(VENV)/bin/promtool

run: venv
	$(PY) examples/zoo/build_zoo.py
	$(VENV)/bin/modelplex local examples/zoo/deployment.yaml --port 8000

# The local cluster: Debian's packages for the node (installed where missing), then the
# Kubernetes, etcd, helm and CoreDNS binaries (built once from their Go modules, cached).
control-plane:
	bash hack/control-plane/node-packages.sh
	bash hack/control-plane/build.sh

lint: venv
	$(VENV)/bin/lint-imports

unit: venv
	$(PY) -m pytest tests/unit

integration: venv tools
	$(PY) -m pytest tests/integration

e2e: venv control-plane
	$(PY) -m pytest tests/e2e

# pytest exits 5 when it collected no test: that fails here, as any non-zero exit does.
test: venv tools lint control-plane
	$(PY) -m pytest tests

# Modelplex against Ray Serve, side by side (bench/results/); BENCH_ARGS=--quick for a smoke run.
bench: venv
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) bench/compare/run.py $(BENCH_ARGS)

# The per-component benchmarks: replica alone, router policies, the streaming pipeline.
bench-components: venv
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) bench/replica/bench_replica.py
	$(PY) bench/router/bench_router.py
	$(PY) bench/pipeline/bench_pipeline.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info examples/zoo/models
