# OOD detection, selective prediction and the abstention gate (audit paper).
# A blurred or artefact copy of a data set's test split is a derived data set `<dataset>__<tag>`: its manifest
# comes from derive_manifest, its embeddings from the ordinary `embed` rule (a real encoder input, never
# feature noise), so adding one sigma or artefact embeds only that copy. One shard job per (encoder, task)
# runs every condition, scorer and gate setting of the task (fmaudit.grid.ood_runs / ood_gate_runs) and
# exports the task's gate; one further-splits job per (encoder, task) runs the audit paper's further splits
# (fmaudit.grid.ood_split_runs); aggregate_ood concatenates both for the report.


include: "ood_helpers.smk"


rule derive_manifest:
    input:
        manifest=f"{RESULTS}/manifests/{{dataset}}.parquet",
    output:
        # named like a data set's manifest, so that `embed` embeds it unchanged (prepare_manifest leaves
        # these names alone: SOURCE_DATASET)
        f"{RESULTS}/manifests/{{dataset}}__{{tag}}.parquet",
    log:
        f"{RESULTS}/logs/derive_manifest/{{dataset}}__{{tag}}.log",
    params:
        spec=derived_spec,
    threads: 1
    resources:
        mem_mb=fixed_mem_mb,
        runtime=fixed_runtime,
    wildcard_constraints:
        tag=PERTURBATION_TAG,
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/derive_manifest.py"


rule ood_shard:
    input:
        unpack(ood_shard_inputs),
    output:
        detection=f"{RESULTS}/shards/ood/{{task}}/{{encoder}}.detection.parquet",
        selective=f"{RESULTS}/shards/ood/{{task}}/{{encoder}}.selective.parquet",
        curves=f"{RESULTS}/shards/ood/{{task}}/{{encoder}}.curves.parquet",
        blur=f"{RESULTS}/shards/ood/{{task}}/{{encoder}}.blur.parquet",
        gate=f"{RESULTS}/shards/ood/{{task}}/{{encoder}}.gate.parquet",
        histograms=f"{RESULTS}/shards/ood/{{task}}/{{encoder}}.histograms.parquet",
        probe_sensitivity=f"{RESULTS}/shards/ood/{{task}}/{{encoder}}.probe_sensitivity.parquet",
        scorer_sensitivity=f"{RESULTS}/shards/ood/{{task}}/{{encoder}}.scorer_sensitivity.parquet",
        slides=f"{RESULTS}/shards/ood/{{task}}/{{encoder}}.slides.parquet",
        coarsening=f"{RESULTS}/shards/ood/{{task}}/{{encoder}}.coarsening.parquet",
        gate_model=directory(f"{RESULTS}/ood/gates/{{task}}/{{encoder}}"),
    log:
        f"{RESULTS}/logs/ood_shard/{{task}}/{{encoder}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/ood_shard/{{task}}/{{encoder}}.tsv"
    params:
        task=ood_task,
        plan=ood_plan,
        settings=ood_settings,
        bootstrap=bootstrap_settings,
        ece_bins=task_ece_bins,
        derived=ood_derived_embeddings,
    threads: 1
    resources:
        mem_mb=shard_mem_mb,
        runtime=shard_runtime,
    group:
        "ood_shard_{encoder}"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/ood_shard.py"


# The audit paper's further train/test splits (ood.extra_splits, default seeds 0-4): probe metrics, slide aggregation
# and the coarsening controls of one (encoder, task) on every split, pooled; the stored split above stays the one
# of detection, blur, scorer sensitivity and the gate.
rule ood_split_shard:
    input:
        unpack(ood_split_shard_inputs),
    output:
        split_selective=f"{RESULTS}/shards/ood_splits/{{task}}/{{encoder}}.split_selective.parquet",
        split_slides=f"{RESULTS}/shards/ood_splits/{{task}}/{{encoder}}.split_slides.parquet",
        split_coarsening=f"{RESULTS}/shards/ood_splits/{{task}}/{{encoder}}.split_coarsening.parquet",
    log:
        f"{RESULTS}/logs/ood_split_shard/{{task}}/{{encoder}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/ood_split_shard/{{task}}/{{encoder}}.tsv"
    params:
        task=ood_task,
        plan=ood_split_plan_params,
        settings=ood_split_settings,
        bootstrap=bootstrap_settings,
        ece_bins=task_ece_bins,
    threads: 1
    resources:
        mem_mb=shard_mem_mb,
        runtime=shard_runtime,
    group:
        "ood_split_shard_{encoder}"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/ood_split_shard.py"


rule aggregate_ood:
    input:
        unpack(ood_aggregate_inputs),
    output:
        detection=f"{RESULTS}/aggregate/ood_detection.parquet",
        selective=f"{RESULTS}/aggregate/ood_selective.parquet",
        curves=f"{RESULTS}/aggregate/ood_curves.parquet",
        blur=f"{RESULTS}/aggregate/ood_blur.parquet",
        gate=f"{RESULTS}/aggregate/ood_gate.parquet",
        histograms=f"{RESULTS}/aggregate/ood_histograms.parquet",
        probe_sensitivity=f"{RESULTS}/aggregate/ood_probe_sensitivity.parquet",
        scorer_sensitivity=f"{RESULTS}/aggregate/ood_scorer_sensitivity.parquet",
        slides=f"{RESULTS}/aggregate/ood_slides.parquet",
        coarsening=f"{RESULTS}/aggregate/ood_coarsening.parquet",
        split_selective=f"{RESULTS}/aggregate/ood_split_selective.parquet",
        split_slides=f"{RESULTS}/aggregate/ood_split_slides.parquet",
        split_coarsening=f"{RESULTS}/aggregate/ood_split_coarsening.parquet",
    log:
        f"{RESULTS}/logs/aggregate_ood.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/aggregate_ood.py"
