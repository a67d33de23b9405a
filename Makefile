# One command each on a fresh Debian machine: `make demo`, `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
COLLECTION_LINK := build/ansible_collections/inferops/numa
APT_PACKAGES := qemu-system-x86 qemu-utils mmdebstrap hwloc numactl systemd openssh-client
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: venv apt test unit lint sanity molecule demo demo-down bench facts clean

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	touch $@

$(COLLECTION_LINK):
	mkdir -p $(dir $@)
	ln -sfn ../../.. $@

venv: $(STAMP) $(COLLECTION_LINK)

apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

unit: venv apt
	$(BIN)/pytest -q tests

test: unit lint sanity

lint: venv
	$(BIN)/ansible-lint --profile production

sanity: venv
	tests/sanity.sh

facts: venv
	$(BIN)/ansible localhost -m numa_facts

demo: venv facts

bench: venv apt
	$(BIN)/python bench/run_all.py

clean:
	rm -rf build $(VENV) tests/output
