# Input functions and helpers of every rule. Rules themselves hold no Python logic.

import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))  # the workflow's own library, also without pip install

from fmaudit.config import check_config, dataset_params, fill_config
from fmaudit.grid import embed_pairs, parts_with, prior_shift_runs, scratch_reference_runs
from fmaudit.grid import section, settings_by_task, shards, task_domains
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
    source_domain=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    target_domain=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    seed=r"[0-9]+",


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


# ---- prior shift (seed 000) ------------------------------------------------------------------------------

# task -> its prior_shift section (top level, or the section of the study that holds the task)
PRIOR_SHIFT = {ps["task"]: ps for _, _, ps in parts_with(config, "prior_shift")}
# The jobs fmaudit.grid counts (fmaudit.grid.JOB_KEYS), with their task: the shards of prior_shift_runs and
# the scratch references of scratch_reference_runs.
PRIOR_SHIFT_SHARDS = (prior_shift_runs(config, DATASETS)[["task", "encoder", "source_domain", "target_domain"]]
                      .astype(str).drop_duplicates().itertuples(index=False))
PRIOR_SHIFT_SHARDS = list(PRIOR_SHIFT_SHARDS)
SCRATCH_JOBS = list(scratch_reference_runs(config, DATASETS)[["task", "source_domain", "seed"]].astype(str)
                    .drop_duplicates().itertuples(index=False))
# Settings that change no number of a shard (they feed the report or the scratch reference) stay out of its params.
NOT_SHARD_SETTINGS = ("model_selection", "scratch_reference")


def prior_shift_shard_path(task, encoder, source, target, kind):
    return f"{RESULTS}/shards/prior_shift/{task}/{encoder}/{source}/{target}.{kind}.parquet"


def all_prior_shift_shards(kind):
    return [prior_shift_shard_path(j.task, j.encoder, j.source_domain, j.target_domain, kind)
            for j in PRIOR_SHIFT_SHARDS]


def all_scratch_references():
    return [f"{RESULTS}/shards/scratch_reference/{j.task}/{j.source_domain}/seed{j.seed}.parquet" for j in SCRATCH_JOBS]


def prior_shift_shard_settings(wildcards):
    """The task's prior_shift section, without the settings that change none of a shard's numbers."""
    ps = PRIOR_SHIFT[wildcards.task]
    return canonical({k: v for k, v in ps.items() if k not in NOT_SHARD_SETTINGS})


def prior_shift_ece_bins(wildcards):
    return section(config, "calibration", task=wildcards.task)["ece_bins"]


def prior_shift_readout(wildcards):
    """The probe grid's readout, resolved for this encoder: the prior-shift probe reads what the probes read."""
    return probe_settings(wildcards)["readout"]


def prior_shift_mem_mb(wildcards, attempt):
    return 8000 * attempt


def prior_shift_runtime(wildcards, attempt):
    return 60 * attempt


def task_manifests(wildcards):
    return [manifest_path(ds) for ds in config["tasks"][wildcards.task]["datasets"]]


def scratch_targets(wildcards):
    """The target domains of this source in the task's prior-shift grid (what the frozen shards evaluate)."""
    return sorted({j.target_domain for j in PRIOR_SHIFT_SHARDS
                   if j.task == wildcards.task and j.source_domain == wildcards.source_domain})


def scratch_pool_settings(wildcards):
    ps = PRIOR_SHIFT[wildcards.task]
    return {"target_pool": ps["target_pool"], "val_fraction": ps["val_fraction"]}


def scratch_settings(wildcards):
    """The training recipe (prior_shift.scratch_reference without its switches)."""
    settings = PRIOR_SHIFT[wildcards.task]["scratch_reference"]
    return canonical({k: v for k, v in settings.items() if k not in ("enabled", "gpu")})


def scratch_gpus(wildcards):
    return 1 if PRIOR_SHIFT[wildcards.task]["scratch_reference"]["gpu"] else 0


def scratch_mem_mb(wildcards, attempt):
    return (32000 if PRIOR_SHIFT[wildcards.task]["scratch_reference"]["gpu"] else 4000) * attempt


def scratch_runtime(wildcards, attempt):
    return (240 if PRIOR_SHIFT[wildcards.task]["scratch_reference"]["gpu"] else 60) * attempt


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


def report_inputs(wildcards):
    """The probe suite's aggregate and predictions, every embedding, and the prior-shift aggregates when the
    config plans prior-shift shards."""
    inputs = {"runs": f"{RESULTS}/aggregate/probe_runs.parquet", "predictions": all_probe_shards("predictions"),
              "embeddings": all_embeddings()}
    if PRIOR_SHIFT_SHARDS:
        inputs.update(prior_shift_runs=f"{RESULTS}/aggregate/prior_shift_runs.parquet",
                      prior_shift_pool=f"{RESULTS}/aggregate/prior_shift_pool.parquet",
                      scratch=f"{RESULTS}/aggregate/scratch_reference.parquet")
    return inputs


def report_prior_shift():
    """{task: what the report reads of its prior_shift section} (selection rules; the rest for its captions)."""
    keys = ("model_selection", "priors", "draws", "sample_size", "seeds")
    return canonical({task: {k: ps[k] for k in keys} for task, ps in PRIOR_SHIFT.items()})


def report_variants():
    """{declared variant: its base encoder}."""
    return {v: ENCODERS[v]["variant_of"] for v in config["variants"]}


def report_exposure():
    """What the exposure audit reads: each evaluated encoder's pretraining facts, each data set's aliases, and
    the (encoder, data set) pairs the config evaluates."""
    pairs = embed_pairs(config)
    encoders = {enc: {"pretraining_corpora": ENCODERS[enc].get("pretraining_corpora") or [],
                      "exposure": ENCODERS[enc].get("exposure") or {},
                      "weights": {"source": ENCODERS[enc]["weights"]["source"]}} for enc, _ in pairs}
    datasets = {ds: {"aliases": DATASETS[ds].get("aliases") or []} for _, ds in pairs}
    return canonical({"encoders": encoders, "datasets": datasets, "pairs": [list(p) for p in pairs]})


def downloadable_datasets(wildcards):
    """Download markers of the config's data sets whose registry entry lists files to fetch."""
    return [f"{RESULTS}/downloads/{ds}.done" for ds in config["datasets"] if DATASETS[ds].get("files")]
