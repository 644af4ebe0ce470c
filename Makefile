# The two commands of the README: `make demo` and `make test`. Everything else is a helper for them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CORES ?= 2
STAMP := $(VENV)/.installed

.PHONY: demo test install lint dryrun report clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch and torchvision first, as the pinned pair (see constraints.txt)
	$(BIN)/pip install --quiet -c constraints.txt torch torchvision
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) --configfile config.yaml
	$(BIN)/snakemake --cores $(CORES) --configfile config.yaml --report results/report/report.html
	@echo
	@echo "Demo report: $(CURDIR)/results/report/ (index.md, tables/, figures/, report.html)"

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/snakemake --lint

dryrun: $(STAMP)
	$(BIN)/snakemake -n

clean:
	rm -rf results .snakemake
