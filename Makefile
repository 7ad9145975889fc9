# `make run` and `make test` each create .venv and install what they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# Use the local CPU torch wheel where pip's config points at one (pinned to its version);
# otherwise PyPI's default build, which runs on CPU too.
TORCH_WHEEL := $(firstword $(wildcard /opt/wheels/torch-*.whl))
TORCH_REQ   := $(if $(TORCH_WHEEL),torch==$(word 2,$(subst -, ,$(notdir $(TORCH_WHEEL)))),torch)

.PHONY: run test test-prereqs venv tools unit integration e2e lint typecheck node-packages control-plane images cluster-prereqs bench-venv bench bench-components clean

# uv installs: it downloads in parallel and links from its cache (~/.cache/uv), so a fresh venv
# takes seconds where pip took minutes unpacking torch again. It trusts the system's CA store
# (UV_NATIVE_TLS), as pip does here, for networks that intercept TLS.
UV_VERSION := 0.13.9
UV_INSTALL  = UV_NATIVE_TLS=1 $(1)/bin/uv pip install -q --python $(1)/bin/python \
              $(if $(TORCH_WHEEL),--find-links $(dir $(TORCH_WHEEL)))

$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) and installing modelplex with its dev and replica extras"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q 'uv==$(UV_VERSION)'
	$(call UV_INSTALL,$(VENV)) '$(TORCH_REQ)' -e '.[replica,dev]'
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

# Debian's packages for the node and for building images (installed where missing).
node-packages:
	bash hack/control-plane/node-packages.sh

# The local cluster's Kubernetes, etcd, helm and CoreDNS binaries and its NetworkPolicy agent
# (kube-router), built once from their Go modules, cached.
control-plane: node-packages
	bash hack/control-plane/build.sh
	bash hack/control-plane/build-policy-agent.sh

# The operator, router and replica images (cached by content hash: a warm run builds none).
images: venv node-packages
	bash hack/images/build.sh

# The two slow steps of a cold run side by side: the Go build keeps the CPU busy while the image
# builds mostly wait on downloads. Their progress lines interleave (each prefixed: `==>`, `[images]`).
cluster-prereqs:
	$(MAKE) --no-print-directory -j2 control-plane images

# ruff and isort first (seconds: pyflakes' checks, import order), then the layers between components.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/isort --check-only --quiet .
	$(VENV)/bin/lint-imports

# mypy over the product packages, strict on modelplex/wire (configured in pyproject.toml).
typecheck: venv
	$(VENV)/bin/mypy

unit: venv
	$(PY) -m pytest tests/unit

integration: venv tools control-plane
	$(PY) -m pytest tests/integration

e2e: venv cluster-prereqs
	$(PY) -m pytest tests/e2e

# Everything `make test` needs. The Go build is CPU-bound and the longest step of a cold run, so
# it runs beside the rest (venv, promtool, lint, typecheck, images), which mostly wait on downloads. The
# Debian packages come first, alone: apt takes one process at a time.
test-prereqs: node-packages
	$(MAKE) --no-print-directory -j2 control-plane tools lint typecheck images

# pytest exits 5 when it collected no test: that fails here, as any non-zero exit does.
# --durations: the slowest tests in every run's log, to keep the CI budget in view.
test: test-prereqs
	$(PY) -m pytest tests --durations=25

# The benchmarks' own venv (bench/.venv): Ray Serve with the protobuf it needs, apart from the
# dev extra's tools, which pin another (Ray 2.60's grpc_reflection refuses protobuf 6.33).
BENCH_VENV  := bench/.venv
BENCH_PY    := $(BENCH_VENV)/bin/python
BENCH_STAMP := $(BENCH_VENV)/.installed

$(BENCH_STAMP): pyproject.toml
	@echo "==> creating $(BENCH_VENV) and installing modelplex with its replica and bench extras"
	test -x $(BENCH_PY) || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_PY) -m pip install -q 'uv==$(UV_VERSION)'
	$(call UV_INSTALL,$(BENCH_VENV)) '$(TORCH_REQ)' -e '.[replica,bench]' py-spy
	touch $(BENCH_STAMP)

bench-venv: $(BENCH_STAMP)

# Modelplex against Ray Serve, side by side (bench/results/); BENCH_ARGS=--quick for a smoke run.
bench: bench-venv
	$(BENCH_PY) bench/compare/run.py $(BENCH_ARGS)

# The per-component benchmarks: replica alone, router policies, the streaming pipeline, fair order.
bench-components: bench-venv
	$(BENCH_PY) bench/replica/bench_replica.py
	$(BENCH_PY) bench/router/bench_router.py
	$(BENCH_PY) bench/pipeline/bench_pipeline.py
	$(BENCH_PY) bench/fairness/run.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info examples/zoo/models
