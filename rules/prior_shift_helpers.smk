# Helpers of rules/prior_shift.smk: the prior-shift shards and scratch references the config plans, their
# settings and resources, and what the prior-shift chapter of the report reads.

from fmaudit.cluster import scratch_request
from fmaudit.grid import parts_with, prior_shift_runs, scratch_reference_runs

# task -> its prior_shift block (top level, or the block of the study that holds the task)
PRIOR_SHIFT = {ps["task"]: ps for _, _, ps in parts_with(config, "prior_shift")}
# The jobs fmaudit.grid counts (fmaudit.grid.JOB_KEYS), with their task: the shards of prior_shift_runs and
# the scratch references of scratch_reference_runs.
PRIOR_SHIFT_SHARDS = (
    prior_shift_runs(config, DATASETS)[["task", "encoder", "source_domain", "target_domain"]]
    .astype(str)
    .drop_duplicates()
    .itertuples(index=False)
)
PRIOR_SHIFT_SHARDS = list(PRIOR_SHIFT_SHARDS)
SCRATCH_JOBS = list(
    scratch_reference_runs(config, DATASETS)[["task", "source_domain", "seed"]]
    .astype(str)
    .drop_duplicates()
    .itertuples(index=False)
)
# Settings that change no number of a shard (they feed the report or the scratch reference) stay out of its params.
NOT_SHARD_SETTINGS = ("model_selection", "scratch_reference")


def prior_shift_task(wildcards):
    """The task as the prior-shift shards and the scratch reference read it (its data, domains and split)."""
    return task_spec(wildcards)


def prior_shift_shard_path(task, encoder, source, target, kind):
    return f"{RESULTS}/shards/prior_shift/{task}/{encoder}/{source}/{target}.{kind}.parquet"


def all_prior_shift_shards(kind):
    return [
        prior_shift_shard_path(j.task, j.encoder, j.source_domain, j.target_domain, kind) for j in PRIOR_SHIFT_SHARDS
    ]


def all_scratch_references():
    return [f"{RESULTS}/shards/scratch_reference/{j.task}/{j.source_domain}/seed{j.seed}.parquet" for j in SCRATCH_JOBS]


def prior_shift_shard_settings(wildcards):
    """The task's prior_shift block, without the settings that change none of a shard's numbers."""
    ps = PRIOR_SHIFT[wildcards.task]
    return canonical({k: v for k, v in ps.items() if k not in NOT_SHARD_SETTINGS})


def prior_shift_readout(wildcards):
    """The probe grid's readout, resolved for this encoder: the prior-shift probe reads what the probes read."""
    return resolved_readout(config_block(config, "probe", task=wildcards.task)["readout"], wildcards.encoder)


def scratch_targets(wildcards):
    """The target domains of this source in the task's prior-shift grid (what the frozen shards evaluate)."""
    return sorted(
        {
            j.target_domain
            for j in PRIOR_SHIFT_SHARDS
            if j.task == wildcards.task and j.source_domain == wildcards.source_domain
        }
    )


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
    return scratch_request(bool(PRIOR_SHIFT[wildcards.task]["scratch_reference"]["gpu"])).at(attempt)[0]


def scratch_runtime(wildcards, attempt):
    return scratch_request(bool(PRIOR_SHIFT[wildcards.task]["scratch_reference"]["gpu"])).at(attempt)[1]


if PRIOR_SHIFT_SHARDS:
    REPORT_INPUTS.update(
        prior_shift_runs=[f"{RESULTS}/aggregate/prior_shift_runs.parquet"],
        prior_shift_pool=[f"{RESULTS}/aggregate/prior_shift_pool.parquet"],
        scratch_reference=[f"{RESULTS}/aggregate/scratch_reference.parquet"],
    )
# {task: what the report reads of its prior_shift block} (selection rules; the rest for its captions)
REPORT_SETTINGS["prior_shift"] = canonical(
    {
        task: {
            **{k: ps[k] for k in ("model_selection", "priors", "assumed_priors", "draws", "sample_size", "seeds")},
            "scratch_reference": bool(ps["scratch_reference"]["enabled"]),
        }
        for task, ps in PRIOR_SHIFT.items()
    }
)


record_signatures(globals())
