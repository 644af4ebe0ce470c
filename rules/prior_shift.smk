# Class-prior shift and label-free adaptation (hema paper): one shard job per (encoder, source domain, target
# domain) of fmaudit.grid.prior_shift_runs, each looping over its source seeds x priors x draws in-process;
# the ResNet-18 trained from scratch as the non-frozen reference, one job per (source domain, seed) when
# prior_shift.scratch_reference.enabled; and one aggregation of every shard across encoders for the report.


include: "prior_shift_helpers.smk"


rule prior_shift_shard:
    input:
        unpack(probe_shard_inputs),
        validated=validated_splits(),
    output:
        runs=f"{RESULTS}/shards/prior_shift/{{task}}/{{encoder}}/{{source_domain}}/{{target_domain}}.runs.parquet",
        pool=f"{RESULTS}/shards/prior_shift/{{task}}/{{encoder}}/{{source_domain}}/{{target_domain}}.pool.parquet",
    log:
        f"{RESULTS}/logs/prior_shift_shard/{{task}}/{{encoder}}/{{source_domain}}/{{target_domain}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/prior_shift_shard/{{task}}/{{encoder}}/{{source_domain}}/{{target_domain}}.tsv"
    params:
        task=prior_shift_task,
        prior_shift=prior_shift_shard_settings,
        ece_bins=task_ece_bins,
        readout=prior_shift_readout,
    threads: 1
    resources:
        mem_mb=shard_mem_mb,
        runtime=shard_runtime,
    group:
        "prior_shift_shard_{encoder}"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/prior_shift_shard.py"


rule scratch_reference:
    input:
        manifests=task_manifests,
        validated=validated_splits(),
    output:
        f"{RESULTS}/shards/scratch_reference/{{task}}/{{source_domain}}/seed{{seed}}.parquet",
    log:
        f"{RESULTS}/logs/scratch_reference/{{task}}/{{source_domain}}/seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/scratch_reference/{{task}}/{{source_domain}}/seed{{seed}}.tsv"
    params:
        task=prior_shift_task,
        targets=scratch_targets,
        pools=scratch_pool_settings,
        settings=scratch_settings,
        ece_bins=task_ece_bins,
    threads: 2
    resources:
        gpu=scratch_gpus,
        mem_mb=scratch_mem_mb,
        runtime=scratch_runtime,
    conda:
        "../envs/scratch.yaml"
    script:
        "../scripts/scratch_reference.py"


rule aggregate_prior_shift:
    input:
        runs=all_prior_shift_shards("runs"),
        pools=all_prior_shift_shards("pool"),
        scratch=all_scratch_references(),
    output:
        runs=f"{RESULTS}/aggregate/prior_shift_runs.parquet",
        pool=f"{RESULTS}/aggregate/prior_shift_pool.parquet",
        scratch=f"{RESULTS}/aggregate/scratch_reference.parquet",
    log:
        f"{RESULTS}/logs/aggregate_prior_shift.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/aggregate_prior_shift.py"
