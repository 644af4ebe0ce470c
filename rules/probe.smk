# The tile-level probe suite: one shard job per (encoder, task), looping over its runs in-process.


include: "probe_helpers.smk"


rule probe_shard:
    input:
        unpack(probe_shard_inputs),
        validated=validated_splits(),
    output:
        runs=f"{RESULTS}/shards/probe/{{task}}/{{encoder}}.runs.parquet",
        predictions=f"{RESULTS}/shards/probe/{{task}}/{{encoder}}.predictions.parquet",
    log:
        f"{RESULTS}/logs/probe_shard/{{task}}/{{encoder}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/probe_shard/{{task}}/{{encoder}}.tsv"
    params:
        task=probe_task,
        probe=probe_settings,
        calibration=calibration_settings,
        bootstrap=bootstrap_settings,
    threads: 1
    resources:
        mem_mb=shard_mem_mb,
        runtime=shard_runtime,
    group:
        "probe_shard_{encoder}"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/probe_shard.py"


rule aggregate_probe:
    input:
        runs=all_probe_shards("runs"),
    output:
        f"{RESULTS}/aggregate/probe_runs.parquet",
    log:
        f"{RESULTS}/logs/aggregate_probe.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/aggregate.py"
