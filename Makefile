# One command each on a fresh Debian machine: `make demo`, `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
COLLECTION_LINK := build/ansible_collections/inferops/numa
# prometheus: promtool, which the tests check the metrics text and the alert rules with. python3-venv: the
# venvs (Debian's python3 has no ensurepip without it; the matrix's oldest core runs on Debian's 3.11). podman,
# runc: the execution environment's build and the lab's run inside it (lab/ee.py; crun refuses this cgroup layout), and
# the container scenario (lab/container.py, reached by openssh-client).
APT_PACKAGES := qemu-system-x86 qemu-utils mmdebstrap e2fsprogs hwloc numactl systemd openssh-client \
	build-essential cmake curl util-linux prometheus python3-venv podman runc
LAB_STAMP := $(VENV)/.lab-installed
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: venv lab-venv apt test unit mutants lint sanity molecule molecule-container demo demo-down bench facts clean

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	touch $@

$(COLLECTION_LINK):
	mkdir -p $(dir $@)
	ln -sfn ../../.. $@

venv: $(STAMP) $(COLLECTION_LINK)

# The lab's model generator (gguf, numpy) only runs on the controller.
$(LAB_STAMP): $(STAMP) lab/llama/requirements.txt
	$(BIN)/pip install -q -r lab/llama/requirements.txt
	touch $@

lab-venv: venv $(LAB_STAMP)

apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# The pure tests (tests/unit: no subprocess, no Ansible run, no network), in well under a minute. `make test` runs
# them and the integration, docs and tooling tests (tests/<kind>/), shuffled, with every tool they need installed.
unit: venv
	$(BIN)/pytest -q -n auto -p no:cacheprovider tests/unit

# Every check, as timed phases overlapped on two cores; ends with a table of phases and wall times.
test:
	$(PYTHON) tests/phases.py

# One boot of the QEMU lab guest proves it all (image and llama-server built once, cached in ~/.cache/inferops-numa).
molecule: apt lab-venv
	$(BIN)/molecule test

# The fast scenario: site.yml on a podman container booting systemd (lab/container.py), in minutes; one NUMA node
# (the host's) and no kernel knobs, which the lab above covers.
molecule-container: apt venv
	$(BIN)/molecule test -s container

# Each decision rule inverted or off by one, one at a time, in a copy of the tree: the fast tests must fail on it.
mutants: venv
	$(BIN)/python tests/mutants.py

lint: venv
	$(BIN)/ansible-lint --profile production

sanity: venv
	tests/sanity.sh

facts: venv
	$(BIN)/ansible localhost -m numa_facts

demo: apt lab-venv
	$(BIN)/python lab/demo.py up

demo-down: venv
	$(BIN)/python lab/demo.py down

bench: apt lab-venv
	cd bench && ../$(BIN)/python start_bench.py && ../$(BIN)/python facts_bench.py && ../$(BIN)/python cost_bench.py \
	  && ../$(BIN)/python llama_bench.py && ../$(BIN)/python gate_noise_bench.py

clean:
	rm -rf build $(VENV) tests/output
