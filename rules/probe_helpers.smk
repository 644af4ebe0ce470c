# Helpers of rules/probe.smk: a probe shard's inputs and settings, every shard's path, and what the probe
# chapters of the report read. The task spec, ECE bins and bootstrap settings are shared (rules/common.smk).

from fmaudit.grid import settings_by_task, shards, task_group_units


def probe_task(wildcards):
    """The task as a probe shard reads it: transfer decides whether each fit is evaluated on the other domains."""
    return task_spec(wildcards, keys=("transfer",))


def probe_shard_inputs(wildcards):
    """Manifests and this encoder's embeddings of the task's data sets: nothing about other encoders."""
    config_name("encoder", wildcards.encoder, "encoders")
    datasets = config["tasks"][config_name("task", wildcards.task, "tasks")]["datasets"]
    return {
        "manifests": [manifest_path(ds) for ds in datasets],
        "embeddings": [embedding_path(wildcards.encoder, ds) for ds in datasets],
    }


def probe_settings(wildcards):
    """The probe grid, with readout `default` resolved to this encoder's own default readout."""
    probe = config_block(config, "probe", task=wildcards.task)
    probe["readout"] = resolved_readout(probe["readout"], wildcards.encoder)
    return canonical(probe)


def calibration_settings(wildcards):
    """The task's whole calibration block: the probe shards read every key of it (the ladder, K-shot, ECE)."""
    return canonical(config_block(config, "calibration", task=wildcards.task))


def shard_path(analysis, task, encoder, kind="runs"):
    return f"{RESULTS}/shards/{analysis}/{task}/{encoder}.{kind}.parquet"


def all_probe_shards(kind):
    return [shard_path("probe", s.task, s.encoder, kind) for s in shards(config)]


REPORT_INPUTS.update(
    probe_runs=[f"{RESULTS}/aggregate/probe_runs.parquet"], probe_predictions=all_probe_shards("predictions")
)
REPORT_SETTINGS.update(
    calibration=canonical(settings_by_task(config, "calibration")),
    bootstrap=canonical(settings_by_task(config, "bootstrap")),
    # {task: the unit its intervals resample} (fmaudit.grid.task_group_units), for the captions
    units=canonical(task_group_units(config, DATASETS)),
    # {declared variant: its base encoder}
    variants={v: ENCODERS[v]["variant_of"] for v in config["variants"]},
)


record_signatures(globals())
