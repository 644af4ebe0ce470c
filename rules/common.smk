# Input functions and helpers of every rule. Rules themselves hold no Python logic.

import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))  # the workflow's own library, also without pip install

from fmaudit.config import check_config, dataset_params, fill_config
from fmaudit.grid import embed_pairs, section, settings_by_task, shards, task_domains
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


def report_units():
    """{task: the unit its intervals resample} (fmaudit.grid.task_group_units), for the report's captions."""
    from fmaudit.grid import task_group_units

    return canonical(task_group_units(config, DATASETS))
