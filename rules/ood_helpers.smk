# Helpers of rules/ood.smk: the OOD shards the config plans and the perturbed copies they need, each shard's
# inputs and settings, and what the OOD chapter of the report reads and states.

import copy

from fmaudit.datasets import preparer_split_strata
from fmaudit.grid import derived_datasets, ood_shard_plan, ood_shards, ood_split_plan, ood_split_shards
from fmaudit.grid.ood import AGGREGATE_TABLES as OOD_AGGREGATE_TABLES
from fmaudit.grid.ood import SHARD_TABLES as OOD_TABLES
from fmaudit.grid.ood import SPLIT_TABLES as OOD_SPLIT_TABLES

# (encoder, task) of every OOD shard, and every perturbed copy of a test split (`<dataset>__<tag>`, blur
# sigmas and image artefacts) the shards need: derived data sets, embedded by the `embed` rule.
OOD_SHARDS = ood_shards(config)
OOD_PLANS = {task: ood_shard_plan(config, task) for task in dict.fromkeys(task for _, task in OOD_SHARDS)}
# the audit paper's further train/test splits (ood.extra_splits): one job per (encoder, task) of an OOD shard
OOD_SPLIT_SHARDS = ood_split_shards(config)
OOD_SPLIT_PLANS = {task: ood_split_plan(config, task) for task in dict.fromkeys(t for _, t in OOD_SPLIT_SHARDS)}
DERIVED = derived_datasets(config)


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
    settings["readout"] = resolved_readout(settings["readout"], wildcards.encoder)
    return canonical(settings)


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


def ood_task(wildcards):
    """The task as the OOD and further-splits shards read it: its entry with its resolved domains (the shard pools
    them; task_spec), ordinal (QWK, and its rows under the grading tasks) and, per data set, the manifest columns
    its split is stratified by (fmaudit.datasets.preparer_split_strata: PANDA's grade and provider), which the
    gate's fit/validation divisions and the further splits are stratified by too."""
    spec = task_spec(wildcards, keys=("ordinal",))
    spec["split_strata"] = {
        ds: list(preparer_split_strata(DATASETS[ds]["preparer"])) for ds in config["tasks"][wildcards.task]["datasets"]
    }
    return canonical(spec)


#: The OOD settings a further-splits job reads (the probe, its readout, the coverages, slide aggregation and the
#: coarsening controls): a scorer, gate or tier setting reruns no further split.
OOD_SPLIT_SETTING_KEYS = ("readout", "probe", "coverages", "slides", "coarsening")


def ood_split_settings(wildcards):
    """The task's OOD settings a further-splits job reads (OOD_SPLIT_SETTING_KEYS), readout resolved."""
    settings = ood_settings(wildcards)
    return canonical({k: settings[k] for k in OOD_SPLIT_SETTING_KEYS if k in settings})


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
    inputs.update(
        {
            table: [ood_split_shard_path(task, enc, table) for enc, task in OOD_SPLIT_SHARDS]
            for table in OOD_SPLIT_TABLES
        }
    )
    return inputs


def ood_aggregate_path(table):
    return f"{RESULTS}/aggregate/ood_{table}.parquet"


def report_ood_settings():
    """{task: its OOD shard's reported settings}: what the OOD captions state."""
    out = {}
    for task, plan in OOD_PLANS.items():
        gate = plan["gate"] or {}
        out[task] = canonical(
            {
                "scorers": plan["settings"]["scorers"],
                "n_boot": config_block(config, "bootstrap", task=task)["n_boot"],
                "ece_bins": config_block(config, "calibration", task=task)["ece_bins"],
                "gate": bool(plan["gate"]),
                "n_splits": gate.get("n_splits", 0),
                "id_reject": gate.get("id_reject", 0),
                "retain": gate.get("retain", 0),
                "probe_C": plan["settings"]["probe"]["C"],
                "ordinal": bool(config["tasks"][task].get("ordinal", False)),
                "extra_splits": (OOD_SPLIT_PLANS.get(task) or {}).get("seeds", []),
            }
        )
    return out


# the aggregated OOD tables, when the config plans any OOD shard (else the report says none ran)
REPORT_INPUTS["ood_tables"] = [ood_aggregate_path(table) for table in OOD_AGGREGATE_TABLES] if OOD_SHARDS else []
REPORT_SETTINGS["ood"] = report_ood_settings()


record_signatures(globals())
