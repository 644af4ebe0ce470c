# Input functions and helpers of every rule. Rules themselves hold no Python logic.

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))  # the workflow's own library, also without pip install

from fmaudit.config import check_config, dataset_params, fill_config
from fmaudit.grid import embed_pairs, section, settings_by_task, shards, task_domains
from fmaudit.grid import derived_datasets, ood_shard_plan, ood_shards
from fmaudit.jobs.ood import SHARD_TABLES as OOD_TABLES
from fmaudit.report import report_outputs

RESULTS = "results"
REPORT = f"{RESULTS}/report"
try:
    # The config is filled from resources/schemas/config.schema.yaml once, here, exactly as the command line
    # fills it (fmaudit.config.fill_config): every default lives in the schema, and rules read sections as
    # they are. check_config is every check `fmaudit check-config` runs.
    fill_config(config)
    ENCODERS, DATASETS = check_config(config)
except (ValueError, FileNotFoundError) as err:
    raise WorkflowError(str(err))


wildcard_constraints:
    encoder=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    dataset=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    task=r"[A-Za-z0-9][A-Za-z0-9._-]*",


def canonical(obj):
    """Dicts with sorted keys, recursively: Snakemake compares params by their printed form, so a rule must
    not rerun because a YAML file listed the same keys in another order."""
    if isinstance(obj, dict):
        return {k: canonical(obj[k]) for k in sorted(obj)}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    return obj


# ---- data ----------------------------------------------------------------------------------------------


def manifest_path(dataset):
    return f"{RESULTS}/manifests/{dataset}.parquet"


def dataset_entry(wildcards):
    """The registry entry of one data set with the config's parameter overrides (params of prepare_manifest)."""
    entry = dict(DATASETS[wildcards.dataset])
    entry["params"] = dataset_params(config, DATASETS, wildcards.dataset)
    return canonical(entry)


def dataset_input_files(wildcards):
    """Files a preparation depends on that live in the repository (slide sheets), so edits re-run it."""
    params = dataset_params(config, DATASETS, wildcards.dataset)
    sheet = params.get("slides")
    return [sheet] if sheet else []


# ---- embeddings ----------------------------------------------------------------------------------------


def embedding_path(encoder, dataset):
    return f"{RESULTS}/embeddings/{encoder}/{dataset}.npz"


def encoder_entry(wildcards):
    """The registry entry of one encoder: a change to it re-embeds only that encoder."""
    return canonical(ENCODERS[wildcards.encoder])


def encoder_weights(wildcards):
    """A local checkpoint that overrides the registry's weight source ('' for none)."""
    return config["encoder_weights"].get(wildcards.encoder, "")


def embed_gpus(wildcards):
    return 1 if ENCODERS[wildcards.encoder].get("gpu", False) else 0


def embed_mem_mb(wildcards, attempt):
    return (16000 if ENCODERS[wildcards.encoder].get("gpu", False) else 2000) * attempt


def embed_runtime(wildcards, attempt):
    return (240 if ENCODERS[wildcards.encoder].get("gpu", False) else 30) * attempt


# ---- probe suite ---------------------------------------------------------------------------------------


def probe_shard_inputs(wildcards):
    """Manifests and this encoder's embeddings of the task's data sets: nothing about other encoders."""
    datasets = config["tasks"][wildcards.task]["datasets"]
    return {
        "manifests": [manifest_path(ds) for ds in datasets],
        "embeddings": [embedding_path(wildcards.encoder, ds) for ds in datasets],
    }


def probe_task(wildcards):
    """The task's config entry with its resolved domains."""
    spec = dict(config["tasks"][wildcards.task])
    spec["domains"] = task_domains(config, wildcards.task, DATASETS)
    return canonical(spec)


def probe_settings(wildcards):
    """The probe grid, with readout `default` resolved to this encoder's own default readout."""
    probe = section(config, "probe", task=wildcards.task)
    if probe["readout"] == "default":
        probe["readout"] = ENCODERS[wildcards.encoder].get("default_readout", "cls")
    return canonical(probe)


def calibration_settings(wildcards):
    return canonical(section(config, "calibration", task=wildcards.task))


def bootstrap_settings(wildcards):
    """What the shards' row intervals use: the paired count feeds only the report, so changing it reruns only
    the report."""
    settings = section(config, "bootstrap", task=wildcards.task)
    return canonical({key: settings[key] for key in ("n_boot", "seed")})


def shard_mem_mb(wildcards, attempt):
    return 4000 * attempt


def shard_runtime(wildcards, attempt):
    return 60 * attempt


def shard_path(analysis, task, encoder, kind="runs"):
    return f"{RESULTS}/shards/{analysis}/{task}/{encoder}.{kind}.parquet"


def all_probe_shards(kind):
    return [shard_path("probe", s.task, s.encoder, kind) for s in shards(config)]


def all_embeddings():
    return [embedding_path(enc, ds) for enc, ds in embed_pairs(config)]


def all_targets():
    return [f"{REPORT}/index.md"]


# ---- OOD detection and the abstention gate (seed 003) ----------------------------------------------------

# (encoder, task) of every OOD shard, and every perturbed copy of a test split (`<dataset>__<tag>`, blur
# sigmas and image artefacts) the shards need: derived data sets, embedded by the `embed` rule.
OOD_SHARDS = ood_shards(config)
OOD_PLANS = {task: ood_shard_plan(config, task) for task in dict.fromkeys(task for _, task in OOD_SHARDS)}
DERIVED = derived_datasets(config)
# tags of perturbations (fmaudit.ood.perturb.perturbation_tag): what a derived manifest's name ends with
PERTURBATION_KINDS = r"(?:blur_s|jpeg_q|exposure_f|pen_seed|bubble_seed|fold_seed)"
PERTURBATION_TAG = rf"{PERTURBATION_KINDS}[0-9.]+(?:_[0-9a-f]{{6}})?"
# a data set prepared from its source: a slug without `__<perturbation>` in it (a derived copy's name)
SOURCE_DATASET = rf"[A-Za-z0-9](?:(?!__{PERTURBATION_KINDS})[A-Za-z0-9._-])*"


def derived_spec(wildcards):
    """The perturbation spec of a derived data set (a change to it re-derives and re-embeds only that copy)."""
    name = f"{wildcards.dataset}__{wildcards.tag}"
    if name not in DERIVED:
        raise WorkflowError(f"{name}: no OOD condition of the config perturbs {wildcards.dataset} as {wildcards.tag!r}")
    return DERIVED[name]["spec"]


def ood_plan(wildcards):
    """The task's OOD conditions and gate (fmaudit.grid.ood_shard_plan), settings apart."""
    plan = OOD_PLANS[wildcards.task]
    return canonical({"conditions": plan["conditions"], "gate": plan["gate"]})


def ood_settings(wildcards):
    """The task's OOD settings, with readout `default` resolved to this encoder's own default readout."""
    settings = copy.deepcopy(OOD_PLANS[wildcards.task]["settings"])
    if settings["readout"] == "default":
        settings["readout"] = ENCODERS[wildcards.encoder].get("default_readout", "cls")
    return canonical(settings)


def ood_task(wildcards):
    """The task's config entry with its resolved domains (the OOD shard pools them)."""
    return probe_task(wildcards)


def _ood_derived(wildcards):
    plan = OOD_PLANS[wildcards.task]
    return [name for cond in plan["conditions"] for name in cond.get("derived", [])]


def ood_shard_inputs(wildcards):
    """The task's manifests and this encoder's embeddings of them, of its far donor's data sets, and of the
    perturbed copies of its test split: nothing about other encoders or tasks."""
    plan = OOD_PLANS[wildcards.task]
    datasets = config["tasks"][wildcards.task]["datasets"]
    donors = [ds for cond in plan["conditions"] if cond["tier"] == "far" for ds in cond["donor"]["datasets"]]
    return {
        "manifests": [manifest_path(ds) for ds in datasets],
        "embeddings": [embedding_path(wildcards.encoder, ds) for ds in datasets],
        "far_manifests": [manifest_path(ds) for ds in donors],
        "far_embeddings": [embedding_path(wildcards.encoder, ds) for ds in donors],
        "derived": [embedding_path(wildcards.encoder, name) for name in _ood_derived(wildcards)],
    }


def ood_derived_embeddings(wildcards):
    """Derived data set -> this encoder's embedding file of it (the shard's `derived` inputs, by name)."""
    return {name: embedding_path(wildcards.encoder, name) for name in _ood_derived(wildcards)}


def ood_shard_path(task, encoder, table):
    return f"{RESULTS}/shards/ood/{task}/{encoder}.{table}.parquet"


def ood_aggregate_inputs(wildcards):
    """Each table of every OOD shard, by table."""
    return {table: [ood_shard_path(task, enc, table) for enc, task in OOD_SHARDS] for table in OOD_TABLES}


def ood_aggregate_path(table):
    return f"{RESULTS}/aggregate/ood_{table}.parquet"


def ood_report_inputs(wildcards):
    """The aggregated OOD tables, when the config plans any OOD shard (else the report says none ran)."""
    return [ood_aggregate_path(table) for table in OOD_TABLES] if OOD_SHARDS else []


def report_ood_settings():
    """{task: its OOD shard's reported settings}: what the OOD captions state."""
    out = {}
    for task, plan in OOD_PLANS.items():
        gate = plan["gate"] or {}
        out[task] = canonical({
            "scorers": plan["settings"]["scorers"], "n_boot": section(config, "bootstrap", task=task)["n_boot"],
            "ece_bins": section(config, "calibration", task=task)["ece_bins"],
            "gate": bool(plan["gate"]), "n_splits": gate.get("n_splits", 0), "id_reject": gate.get("id_reject", 0),
            "retain": gate.get("retain", 0), "probe_C": plan["settings"]["probe"]["C"],
            "ordinal": bool(config["tasks"][task].get("ordinal", False)),
        })
    return out


# ---- report --------------------------------------------------------------------------------------------

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


def report_settings(name):
    """{task: its `name` section}: the report's calibration and bootstrap settings (also in its captions)."""
    return canonical(settings_by_task(config, name))


def downloadable_datasets(wildcards):
    """Download markers of the config's data sets whose registry entry lists files to fetch."""
    return [f"{RESULTS}/downloads/{ds}.done" for ds in config["datasets"] if DATASETS[ds].get("files")]
