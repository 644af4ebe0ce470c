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

# The demo's study folder (config.yaml: `study: demo`); every study writes under results/<study>/.
DEMO_RESULTS := results/demo

demo: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) --configfile config.yaml
	$(BIN)/snakemake --cores $(CORES) --configfile config.yaml --report $(DEMO_RESULTS)/report/report.html
	@echo
	@echo "Demo report: $(CURDIR)/$(DEMO_RESULTS)/report/ (index.md, tables/, figures/, report.html)"

test: $(STAMP)
	$(BIN)/python -m pytest

# ruff over the Python (rules and per-file ignores in pyproject.toml), snakefmt over the workflow's files (line
# length and the house order of directives in pyproject.toml), then Snakemake's own lint of the workflow
lint: $(STAMP)
	$(BIN)/ruff check src tests scripts benchmarks
	$(BIN)/snakefmt --check Snakefile rules
	$(BIN)/snakemake --lint

dryrun: $(STAMP)
	$(BIN)/snakemake -n

# Removes the demo's results and generated data only: other studies under results/ keep their GPU hours.
clean:
	rm -rf $(DEMO_RESULTS) results/demo_data
