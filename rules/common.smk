# Input functions and helpers of every rule. Rules themselves hold no Python logic.

import copy
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))  # the workflow's own library, also without pip install

from fmaudit.config import (
    dataset_params,
    embedded_encoders,
    fill_config,
    manifest_file,
    results_dir,
    weights_override as config_weights_override,
)
from fmaudit.datasets import preparer_split_strata
from fmaudit.preflight import check_config, data_checks, feature_imports, unusable_encoders
from fmaudit.grid import config_block, embed_pairs, settings_by_task, shards, task_domains, task_group_units
from fmaudit.io import FmauditInputError
from fmaudit.registry import embedding_key, embedding_spec, unknown_name_error
from fmaudit.grid import derived_datasets, ood_shard_plan, ood_shards, ood_split_plan, ood_split_shards
from fmaudit.jobs.ood import AGGREGATE_TABLES as OOD_AGGREGATE_TABLES
from fmaudit.jobs.ood import SHARD_TABLES as OOD_TABLES
from fmaudit.jobs.ood import SPLIT_TABLES as OOD_SPLIT_TABLES
from fmaudit.grid import parts_with, prior_shift_runs, scratch_reference_runs
from fmaudit.report import report_outputs, report_reads, report_settings
from fmaudit.report.cards import DECISION, FRONT_PAGE, card_files
from fmaudit.costs import gpu_plan, job_gpus

try:
    # The config is filled from resources/schemas/config.schema.yaml once, here, exactly as the command line
    # fills it (fmaudit.config.fill_config): every default lives in the schema, and rules read sections as
    # they are. check_config is every check `fmaudit check-config` runs; ENCODERS is the registry as this
    # config sees it (encoder_revisions applied).
    fill_config(config)
    ENCODERS, DATASETS = check_config(config)
except (ValueError, FileNotFoundError) as err:
    raise WorkflowError(str(err))

# Everything this study writes goes under results/<study>/ (config `study`, default `demo`): studies live side
# by side in one checkout, and a study's report reads only its own files. Rules build every path from RESULTS.
RESULTS = results_dir(config)
REPORT = f"{RESULTS}/report"
# The data checks of the pre-flight (fmaudit.preflight.check_data), written once every manifest is prepared; every
# job that spends (embeddings, analysis shards) depends on it, so a leak, a class missing from training or an
# unknown class name in the config stops the run before the first embedding. See validated_splits().
VALIDATION = f"{RESULTS}/validation/preflight.tsv"
# What the report reads and states (rules/report.smk builds its inputs and params from the report chapters'
# declarations, fmaudit.report): each branch below registers its files under a report input name
# (fmaudit.report.REPORT_INPUTS) and its settings under a report setting name (fmaudit.report.REPORT_SETTINGS).
REPORT_INPUTS = {}
REPORT_SETTINGS = {}


wildcard_constraints:
    encoder=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    dataset=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    task=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    key=r"[0-9a-f]{12}",
    source_domain=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    target_domain=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    seed=r"[0-9]+",
    section=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    magnification=r"[0-9]+(\.[0-9]+)?",
    protocol=r"IS|IOCD|MOCV|LOOO",


def canonical(obj):
    """Dicts with sorted keys, recursively: Snakemake compares params by their printed form, so a rule must
    not rerun because a YAML file listed the same keys in another order."""
    if isinstance(obj, dict):
        return {k: canonical(obj[k]) for k in sorted(obj)}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    return obj


def config_name(kind, name, key):
    """``name`` when it is one of the config's ``key`` list (encoders, datasets, tasks); otherwise an error naming
    the config key, raised where Snakemake asked for a file of another name (a target given by hand)."""
    known = list(config[key]) + (list(config["variants"]) if key == "encoders" else [])
    if name not in known:
        raise unknown_name_error(kind, name, known, f"config {key!r}")
    return name


# ---- before the first job ------------------------------------------------------------------------------

# Rules that build an encoder (and so may run its remote code): a rule family that builds encoders adds its
# rule name here, so that a run stops before its first job when one of its encoders cannot be built.
ENCODER_BUILDING_RULES = {"embed", "cell_features"}

UNUSABLE_ENCODERS = unusable_encoders(config, ENCODERS)
if UNUSABLE_ENCODERS:
    # a dry run and `fmaudit grid` still show the plan; a run that would embed one of them stops (onstart)
    print("fmaudit: warning: these encoders cannot be embedded yet; a run that embeds them stops before its "
          "first job:\n" + "\n".join(f"  - {why}" for why in UNUSABLE_ENCODERS.values()), file=sys.stderr)


def check_before_first_job():
    """onstart (runs once the DAG is built, before any job; not on dry runs): stop if a job that would build an
    encoder is planned for an encoder that cannot be built as configured (fmaudit.preflight.unusable_encoders:
    remote code without a pinned commit, a registry weight file that is not there)."""
    planned = {job.wildcards.get("encoder") for job in workflow.dag.needrun_jobs()
               if job.rule.name in ENCODER_BUILDING_RULES}
    problems = [UNUSABLE_ENCODERS[enc] for enc in sorted(planned) if enc in UNUSABLE_ENCODERS]
    if problems:
        raise WorkflowError("stopped before the first job:\n" + "\n".join(problems))


def validated_splits():
    """The split validation as an input of every job that spends (embedding, analysis shards), as ancient(), so
    that a rerun of the checks (a task or manifest changed) does not by itself rerun what depends on them; those
    jobs rerun on their own inputs and parameters."""
    return ancient(VALIDATION)


# ---- data ----------------------------------------------------------------------------------------------


def manifest_path(dataset):
    return manifest_file(config, dataset)


def dataset_entry(wildcards):
    """What a data set's preparation depends on: its preparer, its group unit and the registry's parameters with
    the config's overrides (params of prepare_manifest). Its description, licence or citation are left out, so editing them
    rebuilds no manifest (and no embedding after it)."""
    dataset = config_name("dataset", wildcards.dataset, "datasets")
    entry = {"preparer": DATASETS[dataset]["preparer"], "params": dataset_params(config, DATASETS, dataset)}
    if "group_unit" in DATASETS[dataset]:  # what the group column is: the manifest records it for every interval
        entry["group_unit"] = DATASETS[dataset]["group_unit"]
    return canonical(entry)


def download_entry(wildcards):
    """What a data set's download depends on: its files (URLs, checksums) and how to get it otherwise."""
    dataset = config_name("dataset", wildcards.dataset, "datasets")
    return canonical({k: DATASETS[dataset][k] for k in ("files", "how_to_get") if k in DATASETS[dataset]})


def dataset_input_files(wildcards):
    """The sheets a preparation reads (slide sheets; the sheet of an own-data set: image_table, slide_table,
    features), so that editing one prepares the manifest again."""
    params = dataset_params(config, DATASETS, config_name("dataset", wildcards.dataset, "datasets"))
    return [params[key] for key in ("slides", "sheet") if isinstance(params.get(key), str)]


# What the validate job checks (fmaudit.preflight.data_checks): every tile-level task with its resolved domains,
# the manifests they read, the class names the config mentions and the files of every data set it embeds.
DATA_CHECKS = data_checks(config, DATASETS)


# ---- embeddings ----------------------------------------------------------------------------------------

# The key of each encoder's embeddings: a hash of what decides their numbers (fmaudit.registry.EMBEDDING_KEYS:
# architecture, weights with their revision and sha256, preprocessing, readouts, precision) and of the config's
# encoder_weights override. Embeddings lie in a folder of that key: a change that alters the numbers writes a
# new folder and leaves the earlier embeddings where they were (a rerun that fails loses nothing; going back
# finds them done); an edit of a description or licence changes nothing.
def weights_override(encoder):
    """The config's local checkpoint for ``encoder`` ('' for none); a declared variant uses its base's."""
    return config_weights_override(config, ENCODERS, encoder) or ""


# Every encoder the config embeds: its encoders and their declared variants (`variants`, e.g. a resolution check)
EMBEDDED_ENCODERS = embedded_encoders(config)
EMBEDDING_KEY = {enc: embedding_key(ENCODERS[enc], weights_override(enc) or None) for enc in EMBEDDED_ENCODERS}


def embedding_path(encoder, dataset):
    """Where ``encoder``'s embeddings of ``dataset`` lie (every rule that reads embeddings asks here)."""
    return f"{RESULTS}/embeddings/{encoder}/{EMBEDDING_KEY[encoder]}/{dataset}.npz"


# Embeddings computed elsewhere ({(encoder, data set): file, keys, readout} of the config's `features` data sets):
# the import_features rule writes them where the embed rule would (it matches only these data sets, and takes
# precedence: ruleorder in rules/embed.smk), so no embedding job runs for them.
FEATURE_IMPORTS = feature_imports(config, DATASETS)
FEATURE_DATASETS = sorted({ds for _, ds in FEATURE_IMPORTS})
FEATURES_DATASET = "|".join(map(re.escape, FEATURE_DATASETS)) if FEATURE_DATASETS else r"(?!)"


def imported_source(wildcards):
    """What import_features reads for this (encoder, data set), checked against the config and the path's key."""
    encoder = config_name("encoder", wildcards.encoder, "encoders")
    if (encoder, wildcards.dataset) not in FEATURE_IMPORTS:
        raise WorkflowError(f"data set {wildcards.dataset!r} has no feature file of encoder {encoder!r} "
                            f"(dataset_entries.{wildcards.dataset}.params.files)")
    if wildcards.key != EMBEDDING_KEY[encoder]:
        raise FmauditInputError(f"embeddings of {encoder!r} with key {wildcards.key} were asked for; the config gives "
                                f"it the key {EMBEDDING_KEY[encoder]}")
    return FEATURE_IMPORTS[(encoder, wildcards.dataset)]


def imported_features_file(wildcards):
    return imported_source(wildcards)["file"]


def imported_features_source(wildcards):
    return canonical(imported_source(wildcards))


def imported_encoder_entry(wildcards):
    """The encoder entry the imported embeddings are filed under (its number-deciding keys, as embed_encoder)."""
    imported_source(wildcards)
    return canonical(embedding_spec(ENCODERS[wildcards.encoder]))


def embed_encoder(wildcards):
    """The encoder of an embedding job, checked against the config and the key in the requested path."""
    encoder = config_name("encoder", wildcards.encoder, "encoders")
    if wildcards.dataset not in DERIVED:  # a derived data set (OOD perturbations) is named by its plan, not the config
        config_name("dataset", wildcards.dataset, "datasets")
    if wildcards.key != EMBEDDING_KEY[encoder]:
        raise FmauditInputError(
            f"embeddings of {encoder!r} with key {wildcards.key} were asked for, but the config gives encoder "
            f"{encoder!r} the key {EMBEDDING_KEY[encoder]} (its registry entry or config 'encoder_weights' changed); "
            f"ask for {embedding_path(encoder, wildcards.dataset)}")
    return encoder


def encoder_entry(wildcards):
    """What decides an encoder's embeddings (fmaudit.registry.embedding_spec): a change to it (a new key) embeds
    again; descriptive keys (description, licence, exposure, pretraining corpora ...) are left out."""
    return canonical(embedding_spec(ENCODERS[embed_encoder(wildcards)]))


def encoder_weights(wildcards):
    """A local checkpoint that overrides the registry's weight source ('' for none)."""
    return weights_override(embed_encoder(wildcards))


def on_gpu(wildcards):
    """Whether the job's encoder runs on a GPU (its registry entry's `gpu`): the embedding and cell-feature
    jobs' GPU request, threads, memory and wall time follow it."""
    return bool(ENCODERS[wildcards.encoder].get("gpu", False))


def embed_gpus(wildcards):
    """The GPUs of an embedding or cell-feature job (fmaudit.costs.gpu_plan: what the cost report charges)."""
    return job_gpus(GPU_PLAN, "embed", wildcards)


def record_signatures(namespace):
    """Give every function of this workflow's files its parameters once (see the end of the Snakefile)."""
    import inspect

    try:
        from snakemake.common import overwrite_function_params
    except ImportError:  # another Snakemake: only the dry run's speed depends on it
        return
    for value in list(namespace.values()):
        if inspect.isfunction(value) and value.__code__.co_filename.endswith((".smk", "Snakefile")):
            overwrite_function_params(value, inspect.signature(value).parameters)


def embed_threads(wildcards):
    """Threads of an embedding job run without a profile's set-threads (a laptop, the demo, the tests): a GPU
    encoder's job gets two (the forward pass plus one decoding worker); a CPU-only entry (the demo's tiny
    random-init networks) gets one, because its job is mostly interpreter and library start-up, which is serial,
    so two such jobs side by side finish sooner than one job on two threads. Cluster profiles set their own."""
    return 2 if on_gpu(wildcards) else 1


def embed_mem_mb(wildcards, attempt):
    return (16000 if on_gpu(wildcards) else 2000) * attempt


def embed_runtime(wildcards, attempt):
    return (240 if on_gpu(wildcards) else 30) * attempt


# ---- probe suite ---------------------------------------------------------------------------------------


def probe_shard_inputs(wildcards):
    """Manifests and this encoder's embeddings of the task's data sets: nothing about other encoders."""
    config_name("encoder", wildcards.encoder, "encoders")
    datasets = config["tasks"][config_name("task", wildcards.task, "tasks")]["datasets"]
    return {
        "manifests": [manifest_path(ds) for ds in datasets],
        "embeddings": [embedding_path(wildcards.encoder, ds) for ds in datasets],
    }


# Keys of a task that decide its shards' numbers (split: which split column; ordinal: QWK and the grading
# tables of the OOD section); the others (description, label_map, allow_missing_classes) change no number:
# allow_missing_classes only changes what the validate stage accepts.
PROBE_TASK_KEYS = ("datasets", "domains", "transfer", "split", "ordinal")


def probe_task(wildcards):
    """The task's config entry (the keys that decide its runs) with its resolved domains."""
    spec = {k: v for k, v in config["tasks"][wildcards.task].items() if k in PROBE_TASK_KEYS}
    spec["domains"] = task_domains(config, wildcards.task, DATASETS)
    return canonical(spec)


def probe_settings(wildcards):
    """The probe grid, with readout `default` resolved to this encoder's own default readout."""
    probe = config_block(config, "probe", task=wildcards.task)
    if probe["readout"] == "default":
        probe["readout"] = ENCODERS[wildcards.encoder].get("default_readout", "cls")
    return canonical(probe)


def calibration_settings(wildcards):
    return canonical(config_block(config, "calibration", task=wildcards.task))


def bootstrap_settings(wildcards):
    """What the shards' row intervals use: the paired count feeds only the report, so changing it reruns only
    the report."""
    settings = config_block(config, "bootstrap", task=wildcards.task)
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


def report_exposure():
    """What the exposure audit reads: each evaluated encoder's pretraining facts, each data set's aliases, and
    the (encoder, data set) pairs the config evaluates."""
    pairs = embed_pairs(config)
    encoders = {enc: {"pretraining_corpora": ENCODERS[enc].get("pretraining_corpora") or [],
                      "exposure": ENCODERS[enc].get("exposure") or {},
                      "weights": {"source": ENCODERS[enc]["weights"]["source"]}} for enc, _ in pairs}
    datasets = {ds: {"aliases": DATASETS[ds].get("aliases") or []} for _, ds in pairs}
    return canonical({"encoders": encoders, "datasets": datasets, "pairs": [list(p) for p in pairs]})


REPORT_INPUTS.update(probe_runs=[f"{RESULTS}/aggregate/probe_runs.parquet"],
                     probe_predictions=all_probe_shards("predictions"), embeddings=all_embeddings())
REPORT_SETTINGS.update(
    calibration=canonical(settings_by_task(config, "calibration")),
    bootstrap=canonical(settings_by_task(config, "bootstrap")),
    # {task: the unit its intervals resample} (fmaudit.grid.task_group_units), for the captions
    units=canonical(task_group_units(config, DATASETS)),
    # {declared variant: its base encoder}
    variants={v: ENCODERS[v]["variant_of"] for v in config["variants"]},
    exposure=report_exposure(),
)


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


if PRIOR_SHIFT_SHARDS:
    REPORT_INPUTS.update(prior_shift_runs=[f"{RESULTS}/aggregate/prior_shift_runs.parquet"],
                         prior_shift_pool=[f"{RESULTS}/aggregate/prior_shift_pool.parquet"],
                         scratch_reference=[f"{RESULTS}/aggregate/scratch_reference.parquet"])
# {task: what the report reads of its prior_shift section} (selection rules; the rest for its captions)
REPORT_SETTINGS["prior_shift"] = canonical({task: {**{k: ps[k] for k in ("model_selection", "priors", "assumed_priors",
                                                                        "draws", "sample_size", "seeds")},
                                                   "scratch_reference": bool(ps["scratch_reference"]["enabled"])}
                                            for task, ps in PRIOR_SHIFT.items()})


def prior_shift_shard_settings(wildcards):
    """The task's prior_shift section, without the settings that change none of a shard's numbers."""
    ps = PRIOR_SHIFT[wildcards.task]
    return canonical({k: v for k, v in ps.items() if k not in NOT_SHARD_SETTINGS})


def prior_shift_ece_bins(wildcards):
    return config_block(config, "calibration", task=wildcards.task)["ece_bins"]


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
    return job_gpus(GPU_PLAN, "scratch_reference", wildcards)


def scratch_mem_mb(wildcards, attempt):
    return (32000 if PRIOR_SHIFT[wildcards.task]["scratch_reference"]["gpu"] else 4000) * attempt


def scratch_runtime(wildcards, attempt):
    return (240 if PRIOR_SHIFT[wildcards.task]["scratch_reference"]["gpu"] else 60) * attempt


def all_targets():
    return [f"{REPORT}/index.md"]


# ---- OOD detection and the abstention gate (seed 003) ----------------------------------------------------

# (encoder, task) of every OOD shard, and every perturbed copy of a test split (`<dataset>__<tag>`, blur
# sigmas and image artefacts) the shards need: derived data sets, embedded by the `embed` rule.
OOD_SHARDS = ood_shards(config)
OOD_PLANS = {task: ood_shard_plan(config, task) for task in dict.fromkeys(task for _, task in OOD_SHARDS)}
# seed 003's further train/test splits (ood.extra_splits): one job per (encoder, task) of an OOD shard
OOD_SPLIT_SHARDS = ood_split_shards(config)
OOD_SPLIT_PLANS = {task: ood_split_plan(config, task) for task in dict.fromkeys(t for _, t in OOD_SPLIT_SHARDS)}
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
    """The task's config entry with its resolved domains (the OOD shard pools them) and, per data set, the manifest
    columns its split is stratified by (fmaudit.datasets.preparer_split_strata: PANDA's grade and provider), which
    the gate's fit/validation divisions and the further splits are stratified by too."""
    spec = probe_task(wildcards)
    spec["split_strata"] = {ds: list(preparer_split_strata(DATASETS[ds]["preparer"]))
                            for ds in config["tasks"][wildcards.task]["datasets"]}
    return canonical(spec)


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


def ood_split_plan_params(wildcards):
    """The task's further splits: seeds, test fraction and the parts they evaluate (fmaudit.grid.ood_split_plan)."""
    return canonical(OOD_SPLIT_PLANS[wildcards.task])


def ood_split_shard_inputs(wildcards):
    """The task's manifests and this encoder's embeddings of them: nothing about other encoders or tasks."""
    return probe_shard_inputs(wildcards)


def ood_shard_path(task, encoder, table):
    return f"{RESULTS}/shards/ood/{task}/{encoder}.{table}.parquet"


def ood_split_shard_path(task, encoder, table):
    return f"{RESULTS}/shards/ood_splits/{task}/{encoder}.{table}.parquet"


def ood_aggregate_inputs(wildcards):
    """Each table of every OOD shard and further-splits job, by table."""
    inputs = {table: [ood_shard_path(task, enc, table) for enc, task in OOD_SHARDS] for table in OOD_TABLES}
    inputs.update({table: [ood_split_shard_path(task, enc, table) for enc, task in OOD_SPLIT_SHARDS]
                   for table in OOD_SPLIT_TABLES})
    return inputs


def ood_aggregate_path(table):
    return f"{RESULTS}/aggregate/ood_{table}.parquet"


def report_ood_settings():
    """{task: its OOD shard's reported settings}: what the OOD captions state."""
    out = {}
    for task, plan in OOD_PLANS.items():
        gate = plan["gate"] or {}
        out[task] = canonical({
            "scorers": plan["settings"]["scorers"], "n_boot": config_block(config, "bootstrap", task=task)["n_boot"],
            "ece_bins": config_block(config, "calibration", task=task)["ece_bins"],
            "gate": bool(plan["gate"]), "n_splits": gate.get("n_splits", 0), "id_reject": gate.get("id_reject", 0),
            "retain": gate.get("retain", 0), "probe_C": plan["settings"]["probe"]["C"],
            "ordinal": bool(config["tasks"][task].get("ordinal", False)),
            "extra_splits": (OOD_SPLIT_PLANS.get(task) or {}).get("seeds", []),
        })
    return out


# the aggregated OOD tables, when the config plans any OOD shard (else the report says none ran)
REPORT_INPUTS["ood_tables"] = [ood_aggregate_path(table) for table in OOD_AGGREGATE_TABLES] if OOD_SHARDS else []
REPORT_SETTINGS["ood"] = report_ood_settings()


# ---- report --------------------------------------------------------------------------------------------

# The GPUs each GPU-capable job requests (its `gpu` resource): the rules and the cost report read the same plan.
GPU_PLAN = gpu_plan(config, ENCODERS, PRIOR_SHIFT)


def planned_benchmarks():
    """The benchmark file of every planned job that writes one (the rules' `benchmark:` paths), for the cost
    chapter of the report; tests/test_workflow.py checks them against the files a demo run writes."""
    bench = f"{RESULTS}/benchmarks"
    embedded = set(embed_pairs(config))
    for encoder, task in OOD_SHARDS:
        plan = OOD_PLANS[task]
        donors = [ds for cond in plan["conditions"] if cond["tier"] == "far" for ds in cond["donor"]["datasets"]]
        derived = [name for cond in plan["conditions"] for name in cond.get("derived", [])]
        embedded |= {(encoder, ds) for ds in [*config["tasks"][task]["datasets"], *donors, *derived]}
    out = [f"{bench}/prepare_manifest/{ds}.tsv" for ds in config["datasets"]
           if DATASETS[ds].get("kind") != "xenium_cells"]
    out += [f"{bench}/embed/{enc}/{EMBEDDING_KEY[enc]}/{ds}.tsv" for enc, ds in sorted(embedded)]
    out += [f"{bench}/probe_shard/{s.task}/{s.encoder}.tsv" for s in shards(config)]
    out += [f"{bench}/ood_shard/{task}/{enc}.tsv" for enc, task in OOD_SHARDS]
    out += [f"{bench}/ood_split_shard/{task}/{enc}.tsv" for enc, task in OOD_SPLIT_SHARDS]
    out += [f"{bench}/prior_shift_shard/{j.task}/{j.encoder}/{j.source_domain}/{j.target_domain}.tsv"
            for j in PRIOR_SHIFT_SHARDS]
    out += [f"{bench}/scratch_reference/{j.task}/{j.source_domain}/seed{j.seed}.tsv" for j in SCRATCH_JOBS]
    if CELL_PLAN is not None:
        out += [f"{bench}/prepare_cell_section/{s}.tsv" for s in CELL_PLAN.sections]
        out += [f"{bench}/cell_features/{e}/{EMBEDDING_KEY[e]}/{mag(m)}x/{s}.tsv" for e, s, m in CELL_PLAN.feature_jobs]
        out += [f"{bench}/cell_shard/{p}/{e}/{mag(m)}x.tsv" for e, m, p in CELL_PLAN.shard_jobs]
    return list(dict.fromkeys(out))


def report_cards():
    """Every reliability card the report writes (fmaudit.report.cards), one per encoder of the config, and the
    front page; their HTML pages appear in Snakemake's report, which links them from its first screen."""
    out = []
    for path in card_files(config["encoders"]):
        caption = "front_page" if path == FRONT_PAGE else "card"
        out.append(report(f"{REPORT}/{path}", caption=f"../resources/report/pages/{caption}.rst", category=DECISION)
                   if path.endswith(".html") else f"{REPORT}/{path}")
    return out


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


def report_inputs():
    """Every report input some report chapter reads (fmaudit.report.report_reads), by name: the files the branches
    registered under it in REPORT_INPUTS, none where the config plans nothing of it."""
    return {name: list(REPORT_INPUTS.get(name, [])) for name in report_reads()}


def report_params():
    """Every report setting some report chapter states (fmaudit.report.report_settings), by name."""
    missing = [name for name in report_settings() if name not in REPORT_SETTINGS]
    if missing:
        raise WorkflowError(f"report settings {missing} are stated by a report chapter but no rule file registers them")
    return {name: REPORT_SETTINGS[name] for name in report_settings()}


def downloadable_datasets(wildcards):
    """Download markers of the config's data sets whose registry entry lists files to fetch."""
    return [f"{RESULTS}/downloads/{ds}.done" for ds in config["datasets"] if DATASETS[ds].get("files")]


from fmaudit.grid import cell_plan, protocol_sections
from fmaudit.cells.table import section_lists

try:
    # The cell branch as the workflow plans it (fmaudit.grid.cell_plan): sections with their organ and data
    # set, one feature job per (encoder, section, magnification), one shard per (encoder, magnification,
    # protocol). Built from the config's factors, never from the run table, so a 300,000-run grid plans fast.
    # each cell-level data set's sections: a xenium_cells set's `sections`, a cell_table's slides
    CELL_PLAN = cell_plan(config, section_lists(config, DATASETS))
except FmauditInputError as err:
    raise WorkflowError(str(err))
CELLS = f"{RESULTS}/cells"
# The cell branch's split checks (fmaudit.split_checks.validate_cell_panel), once every section is prepared;
# every feature and shard job depends on it (as ancient(), like validated_splits()).
CELL_VALIDATION = f"{RESULTS}/validation/cells.tsv"
CELL_RUNS = f"{RESULTS}/aggregate/cell_runs.parquet"


def mag(m):
    """A magnification as it appears in paths and wildcards: 20, 10, 40 (12.5 stays 12.5)."""
    return f"{float(m):g}"


def cell_manifest_path(section):
    return f"{CELLS}/sections/{section}.parquet"


def cell_qc_path(section):
    return f"{CELLS}/qc/{section}.png"


def cell_features_path(encoder, section, magnification):
    """A feature folder, under the encoder's embedding key (a change of what decides the numbers writes beside
    the earlier features instead of over them)."""
    return f"{CELLS}/features/{encoder}/{EMBEDDING_KEY[encoder]}/{mag(magnification)}x/{section}"


def cell_shard_path(protocol, encoder, magnification):
    return f"{RESULTS}/shards/cells/{protocol}/{encoder}/{mag(magnification)}x.parquet"


def validated_cells():
    return ancient(CELL_VALIDATION)


def cell_section(wildcards):
    """What a section's preparation depends on: its id, organ, data set and the data set's parameters."""
    if CELL_PLAN is None or wildcards.section not in CELL_PLAN.organ_of:
        raise unknown_name_error("section", wildcards.section, CELL_PLAN.sections if CELL_PLAN else [], "config 'cells.sections'")
    dataset = CELL_PLAN.dataset_of[wildcards.section]
    entry = {"section": wildcards.section, "organ": CELL_PLAN.organ_of[wildcards.section], "dataset": dataset,
             "params": dataset_params(config, DATASETS, dataset)}
    if DATASETS[dataset]["kind"] != "xenium_cells":  # (Xenium sections' params stay as they were: no rerun)
        entry["kind"] = DATASETS[dataset]["kind"]
    return canonical(entry)


def cell_section_inputs(wildcards):
    """The sheets a cell_table section is read from (an edit prepares it again); a Xenium section has none here."""
    cell_section(wildcards)
    dataset = CELL_PLAN.dataset_of[wildcards.section]
    if DATASETS[dataset]["kind"] != "cell_table":
        return []
    params = dataset_params(config, DATASETS, dataset)
    return [params["slides"], params["cells"]]


def cell_taxonomies():
    """taxonomy name -> its task and the class names the task allows to be missing from training."""
    return canonical({name: {"task": task, "allow_missing_classes": list(config["tasks"][task].get("allow_missing_classes") or [])}
                      for name, task in CELL_PLAN.taxonomy_tasks.items()})


def cell_validation_settings():
    """What the cell checks depend on: sections, protocols and the probe's draw sizes (no encoder)."""
    cells = CELL_PLAN.cells
    return canonical({k: cells[k] for k in ("sections", "protocols", "probe")})


def cell_encoder(wildcards):
    encoder = config_name("encoder", wildcards.encoder, "encoders")
    if wildcards.key != EMBEDDING_KEY[encoder]:
        raise FmauditInputError(
            f"cell features of {encoder!r} with key {wildcards.key} were asked for, but the config gives encoder "
            f"{encoder!r} the key {EMBEDDING_KEY[encoder]}")
    return encoder


CELL_ENCODER_ENTRIES = {}


def cell_encoder_entry(wildcards):
    """What decides an encoder's cell features (as encoder_entry for embeddings); computed once per encoder:
    the CellPath preset asks 2,250 times."""
    encoder = cell_encoder(wildcards)
    if encoder not in CELL_ENCODER_ENTRIES:
        CELL_ENCODER_ENTRIES[encoder] = canonical(embedding_spec(ENCODERS[encoder]))
    return CELL_ENCODER_ENTRIES[encoder]


def cell_encoder_weights(wildcards):
    return weights_override(cell_encoder(wildcards))


def cell_feature_set_path(encoder, magnification):
    """The merge of one encoder's feature folders at one magnification (every section), which the shards read:
    one input per shard instead of two per section keeps the preset's dry run fast."""
    return f"{CELLS}/features/{encoder}/{EMBEDDING_KEY[encoder]}/{mag(magnification)}x.json"


def cell_feature_set_inputs(wildcards):
    """Every section's feature folder of this encoder and magnification, and the sections' manifests."""
    cell_encoder(wildcards)
    sections = sorted(CELL_PLAN.sections)  # the order of params.sections: a reordered config reruns nothing
    return {
        "manifests": [cell_manifest_path(s) for s in sections],
        "features": [cell_features_path(wildcards.encoder, s, wildcards.magnification) for s in sections],
    }


def cell_shard_inputs(wildcards):
    """This encoder's feature set at this magnification and the MOCV fold manifest: nothing of other encoders
    or magnifications."""
    config_name("encoder", wildcards.encoder, "encoders")
    spec = CELL_PLAN.cells["protocols"][wildcards.protocol]
    folds = [spec["fold_manifest"]] if wildcards.protocol == "MOCV" and spec.get("fold_manifest") else []
    return {"features": cell_feature_set_path(wildcards.encoder, wildcards.magnification), "folds": folds}


CELL_SHARD_SETTINGS = {}


def cell_shard_settings(wildcards):
    """The cells section as one protocol's shard reads it: its own protocol only, no encoder list and no
    magnification list, so adding an encoder, a magnification or another protocol's seed reruns no shard."""
    if wildcards.protocol not in CELL_SHARD_SETTINGS:
        cells = CELL_PLAN.cells
        out = {k: cells[k] for k in ("taxonomies", "sections", "readouts", "probe")}
        out["protocols"] = {wildcards.protocol: cells["protocols"][wildcards.protocol]}
        out["read_sections"] = protocol_sections(cells, wildcards.protocol)
        CELL_SHARD_SETTINGS[wildcards.protocol] = canonical(out)
    return CELL_SHARD_SETTINGS[wildcards.protocol]


def all_cell_shards():
    if CELL_PLAN is None:
        return []
    return [cell_shard_path(p, e, m) for e, m, p in CELL_PLAN.shard_jobs]


def all_cell_features():
    if CELL_PLAN is None:
        return []
    return [cell_features_path(e, s, m) for e, s, m in CELL_PLAN.feature_jobs]


def cell_report_settings():
    """What the cell chapter of the report states: magnifications, protocols with their seeds, taxonomies, the
    pretraining scale of each encoder (the landscape's point size, from the registry), the panel's sections and
    the nested section subsets (cells.subsets: sizes and lists; a scores table is an input of the report)."""
    if CELL_PLAN is None:  # the captions still render (the chapter's outputs are notes then)
        return {"magnifications": [], "protocols": {}, "taxonomies": {}, "readouts": [], "pretraining_wsis": {},
                "sections": [], "subsets": {}}
    cells = CELL_PLAN.cells
    subsets = {k: v for k, v in (cells.get("subsets") or {}).items() if k != "scores"}  # the scores are an input
    return canonical({"magnifications": [float(m) for m in cells["magnifications"]], "protocols": cells["protocols"],
                      "taxonomies": dict(cells["taxonomies"]), "readouts": list(cells["readouts"]),
                      "pretraining_wsis": {e: ENCODERS[e].get("pretraining_wsis") for e in CELL_PLAN.encoders},
                      "sections": list(CELL_PLAN.sections), "subsets": subsets})


if CELL_PLAN is not None:
    REPORT_INPUTS.update(cell_runs=[CELL_RUNS], cell_qc=[cell_qc_path(s) for s in CELL_PLAN.sections],
                         cell_manifests=[cell_manifest_path(s) for s in CELL_PLAN.sections])
    scores = (CELL_PLAN.cells.get("subsets") or {}).get("scores")  # the table ranking sections for the subsets
    REPORT_INPUTS["cell_subset_scores"] = [scores] if scores else []
REPORT_SETTINGS["cells"] = cell_report_settings()
# the Paper check's claims files (config claims), checked against the report's own tables
REPORT_INPUTS["claims"] = list(config["claims"])
