# Helpers of rules/report.smk: the report rule is built from the report chapters' declarations (fmaudit.report),
# its inputs from the files the branches' helpers registered in REPORT_INPUTS and its params from the settings
# they registered in REPORT_SETTINGS (rules/common.smk). Included last, after every branch registered.

from fmaudit.grid import embed_pairs
from fmaudit.report import report_outputs, report_reads, report_settings


def report_exposure():
    """What the exposure audit reads: each evaluated encoder's pretraining facts, each data set's aliases, and
    the (encoder, data set) pairs the config evaluates."""
    pairs = embed_pairs(config)
    encoders = {enc: {"pretraining_corpora": ENCODERS[enc].get("pretraining_corpora") or [],
                      "exposure": ENCODERS[enc].get("exposure") or {},
                      "weights": {"source": ENCODERS[enc]["weights"]["source"]}} for enc, _ in pairs}
    datasets = {ds: {"aliases": DATASETS[ds].get("aliases") or []} for _, ds in pairs}
    return canonical({"encoders": encoders, "datasets": datasets, "pairs": [list(p) for p in pairs]})


# the exposure audit (pretraining corpora against evaluated data sets) belongs to no branch: the report states it
REPORT_SETTINGS["exposure"] = report_exposure()
# the Paper check's claims files (config claims), checked against the report's own tables
REPORT_INPUTS["claims"] = list(config["claims"])

# Every table and figure the report writes (fmaudit.report.report_outputs), so the report rule declares
# exactly what it writes; each CSV and figure carries its caption, resources/report/{tables,figures}/<name>.rst.
REPORT_OUTPUTS = report_outputs()


def report_tables():
    return [report(f"{REPORT}/tables/{name}.csv", caption=f"../resources/report/tables/{name}.rst", category=category)
            for name, category in REPORT_OUTPUTS["tables"].items()]


def report_table_formats():
    """The Markdown and LaTeX copies of every table."""
    return [f"{REPORT}/tables/{name}{ext}" for name in REPORT_OUTPUTS["tables"] for ext in (".md", ".tex")]


def report_figures():
    return [report(f"{REPORT}/figures/{name}.png", caption=f"../resources/report/figures/{name}.rst", category=category)
            for name, category in REPORT_OUTPUTS["figures"].items()]


def all_targets():
    """The default target (the Snakefile's `all`): every file the report writes, not its index.md alone, so that a
    table or figure the report does not have yet (a new analysis's chapter) reruns it on a finished study."""
    return [f"{REPORT}/index.md", *[f"{REPORT}/tables/{name}.csv" for name in REPORT_OUTPUTS["tables"]],
            *report_table_formats(), *[f"{REPORT}/figures/{name}.png" for name in REPORT_OUTPUTS["figures"]]]


def report_inputs():
    """Every report input some report chapter reads (fmaudit.report.report_reads), by name: the files the branches
    registered under it in REPORT_INPUTS, none where the config plans nothing of it."""
    return {name: list(REPORT_INPUTS.get(name, [])) for name in report_reads()}


def report_params():
    """Every report setting some report chapter states (fmaudit.report.report_settings), by name."""
    missing = [name for name in report_settings() if name not in REPORT_SETTINGS]
    if missing:
        raise WorkflowError(f"report settings {missing} are stated by a report chapter but no helpers file "
                            "registers them")
    return {name: REPORT_SETTINGS[name] for name in report_settings()}


record_signatures(globals())
