# Helpers of rules/report.smk: the report rule is built from the report chapters' declarations (fmaudit.report),
# its inputs from the files the branches' helpers registered in REPORT_INPUTS and its params from the settings
# they registered in REPORT_SETTINGS (rules/common.smk). Included last, after every branch registered.

from fmaudit.costs import gpu_plan
from fmaudit.grid import embed_pairs, shards
from fmaudit.report import report_outputs, report_reads, report_settings
from fmaudit.report.cards import DECISION, FRONT_PAGE, card_files


def report_exposure():
    """What the exposure audit reads: each evaluated encoder's pretraining facts, each data set's aliases, and
    the (encoder, data set) pairs the config evaluates."""
    pairs = embed_pairs(config)
    encoders = {
        enc: {
            "pretraining_corpora": ENCODERS[enc].get("pretraining_corpora") or [],
            "exposure": ENCODERS[enc].get("exposure") or {},
            "weights": {"source": ENCODERS[enc]["weights"]["source"]},
        }
        for enc, _ in pairs
    }
    datasets = {ds: {"aliases": DATASETS[ds].get("aliases") or []} for _, ds in pairs}
    return canonical({"encoders": encoders, "datasets": datasets, "pairs": [list(p) for p in pairs]})


# the exposure audit (pretraining corpora against evaluated data sets) belongs to no branch: the report states it
REPORT_SETTINGS["exposure"] = report_exposure()
# the Paper check's claims files (config claims), checked against the report's own tables
REPORT_INPUTS["claims"] = list(config["claims"])

# The GPUs each GPU-capable job requests (its `gpu` resource: embed_gpus, scratch_gpus): the rules and the cost
# report read the same plan.
GPU_PLAN = gpu_plan(config, ENCODERS, PRIOR_SHIFT)


def planned_benchmarks():
    """The benchmark file of every planned job that writes one (the rules' `benchmark:` paths), for the cost
    chapter of the report; tests/test_workflow.py checks them against the files a demo run writes. Embeddings
    imported from a feature file (import_features) have none."""
    bench = f"{RESULTS}/benchmarks"
    embedded = set(embed_pairs(config))
    for encoder, task in OOD_SHARDS:
        plan = OOD_PLANS[task]
        donors = [ds for cond in plan["conditions"] if cond["tier"] == "far" for ds in cond["donor"]["datasets"]]
        derived = [name for cond in plan["conditions"] for name in cond.get("derived", [])]
        embedded |= {(encoder, ds) for ds in [*config["tasks"][task]["datasets"], *donors, *derived]}
    embedded -= set(FEATURE_IMPORTS)
    out = [
        f"{bench}/prepare_manifest/{ds}.tsv"
        for ds in config["datasets"]
        if DATASETS[ds].get("kind") not in ("xenium_cells", "cell_table")
    ]
    out += [f"{bench}/embed/{enc}/{EMBEDDING_KEY[enc]}/{ds}.tsv" for enc, ds in sorted(embedded)]
    out += [f"{bench}/probe_shard/{s.task}/{s.encoder}.tsv" for s in shards(config)]
    out += [f"{bench}/ood_shard/{task}/{enc}.tsv" for enc, task in OOD_SHARDS]
    out += [f"{bench}/ood_split_shard/{task}/{enc}.tsv" for enc, task in OOD_SPLIT_SHARDS]
    out += [
        f"{bench}/prior_shift_shard/{j.task}/{j.encoder}/{j.source_domain}/{j.target_domain}.tsv"
        for j in PRIOR_SHIFT_SHARDS
    ]
    out += [f"{bench}/scratch_reference/{j.task}/{j.source_domain}/seed{j.seed}.tsv" for j in SCRATCH_JOBS]
    if CELL_PLAN is not None:
        out += [f"{bench}/prepare_cell_section/{s}.tsv" for s in CELL_PLAN.sections]
        out += [f"{bench}/cell_features/{e}/{EMBEDDING_KEY[e]}/{s}.tsv" for e, s in CELL_PLAN.feature_jobs]
        out += [f"{bench}/cell_shard/{p}/{e}/{mag(m)}x.tsv" for e, m, p in CELL_PLAN.shard_jobs]
    return list(dict.fromkeys(out))


def report_cards():
    """Every reliability card the report writes (fmaudit.report.cards), one per encoder of the config, and the
    front page; their HTML pages appear in Snakemake's report, which links them from its first screen."""
    out = []
    for path in card_files(config["encoders"]):
        caption = "front_page" if path == FRONT_PAGE else "card"
        page = f"{REPORT}/{path}"
        # (a line of these files that starts with the word report reads as a report: directive to snakefmt)
        out.append(report_entry(page, f"pages/{caption}", DECISION) if path.endswith(".html") else page)
    return out


# The cost chapter reads every planned job's benchmark file; the cards are one per encoder of the config.
REPORT_INPUTS["benchmarks"] = planned_benchmarks()
REPORT_SETTINGS["cost"] = {"gpu_plan": GPU_PLAN}
REPORT_SETTINGS["cards"] = {"study": config["study"], "encoders": list(config["encoders"])}

# Every table and figure the report writes (fmaudit.report.report_outputs), so the report rule declares
# exactly what it writes; each CSV and figure carries its caption, resources/report/{tables,figures}/<name>.rst.
REPORT_OUTPUTS = report_outputs()


def report_entry(path, caption, category):
    """``path`` in Snakemake's HTML report, captioned by resources/report/<caption>.rst, under ``category``."""
    return report(path, caption=f"../resources/report/{caption}.rst", category=category)


def report_tables():
    return [
        report_entry(f"{REPORT}/tables/{name}.csv", f"tables/{name}", category)
        for name, category in REPORT_OUTPUTS["tables"].items()
    ]


def report_table_formats():
    """The Markdown and LaTeX copies of every table."""
    return [f"{REPORT}/tables/{name}{ext}" for name in REPORT_OUTPUTS["tables"] for ext in (".md", ".tex")]


def report_figures():
    return [
        report_entry(f"{REPORT}/figures/{name}.png", f"figures/{name}", category)
        for name, category in REPORT_OUTPUTS["figures"].items()
    ]


def all_targets():
    """The default target (the Snakefile's `all`): every file the report writes, not its index.md alone, so that a
    table or figure the report does not have yet (a new analysis's chapter) reruns it on a finished study."""
    return [
        f"{REPORT}/index.md",
        f"{REPORT}/index.html",
        *[f"{REPORT}/{p}" for p in card_files(config["encoders"])],
        *[f"{REPORT}/tables/{name}.csv" for name in REPORT_OUTPUTS["tables"]],
        *report_table_formats(),
        *[f"{REPORT}/figures/{name}.png" for name in REPORT_OUTPUTS["figures"]],
    ]


def report_inputs():
    """Every report input some report chapter reads (fmaudit.report.report_reads), by name: the files the branches
    registered under it in REPORT_INPUTS, none where the config plans nothing of it."""
    return {name: list(REPORT_INPUTS.get(name, [])) for name in report_reads()}


def report_params():
    """Every report setting some report chapter states (fmaudit.report.report_settings), by name."""
    missing = [name for name in report_settings() if name not in REPORT_SETTINGS]
    if missing:
        raise WorkflowError(
            f"report settings {missing} are stated by a report chapter but no helpers file registers them"
        )
    return {name: REPORT_SETTINGS[name] for name in report_settings()}


record_signatures(globals())
