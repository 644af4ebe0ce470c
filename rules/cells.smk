# The cell branch (CellPath-Bench): Xenium sections registered to their H&E (or the slides of a
# cell_table: the user's own cells, fmaudit.cells.table), checked, embedded at
# their nuclei per (encoder, section) at every magnification, probed per (encoder, magnification, protocol) shard,
# aggregated for the report. Planned from CELL_PLAN (rules/cells_helpers.smk, fmaudit.grid.cell_plan); nothing here
# when the config has no `cells` block.


include: "cells_helpers.smk"


# One section: registration through its alignment (fmaudit.cells.prepare; a cell_table slide: its cells as given,
# fmaudit.cells.table), labels through the taxonomy tables, a QC overlay; a section with fewer than two valid
# classes is written, marked excluded and the reason logged.
rule prepare_cell_section:
    input:
        cell_section_inputs,
    output:
        manifest=f"{CELLS}/sections/{{section}}.parquet",
        qc=f"{CELLS}/qc/{{section}}.png",
    log:
        f"{RESULTS}/logs/prepare_cell_section/{{section}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/prepare_cell_section/{{section}}.tsv"
    params:
        section=cell_section,
        data_root=config["data_root"],
    threads: 1
    resources:
        mem_mb=fixed_mem_mb,
        runtime=fixed_runtime,
    conda:
        "../envs/slides.yaml"
    script:
        "../scripts/prepare_cell_section.py"


# Every check of the panel that can fail on cell data (fmaudit.split_checks.validate_cell_panel), once every
# section is prepared and before the first feature job: excluded sections, leakage, two classes in training,
# every test class in training (or allowed by name in the taxonomy task's allow_missing_classes).
rule validate_cells:
    input:
        manifests=cell_section_manifests,
    output:
        CELL_VALIDATION,
    log:
        f"{RESULTS}/logs/validate_cells.log",
    params:
        sections=cell_sections,
        cells=cell_validation_settings,
        taxonomies=cell_taxonomies,
    threads: 1
    resources:
        mem_mb=8000,
        runtime=60,
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/validate_cells.py"


# Nucleus-anchored features of one (encoder, section) at every magnification of the config: a folder and a log per
# magnification, the encoder loaded once for all of them; a GPU job for real encoders, resumable in chunks; under
# the encoder's embedding key like the tile embeddings. A cluster runs an encoder's jobs a few to a submission
# (group cell_features_<encoder>, profiles/slurm: group-components) and sizes each from the encoder and the
# section (rules/common.smk, resources).
rule cell_features:
    input:
        manifest=f"{CELLS}/sections/{{section}}.parquet",
        validated=validated_cells(),
    output:
        *cell_feature_folders(),
    log:
        *cell_feature_logs(),
    benchmark:
        f"{RESULTS}/benchmarks/cell_features/{{encoder}}/{{key}}/{{section}}.tsv"
    params:
        encoder=cell_encoder_entry,
        weights=cell_encoder_weights,
        magnifications=cell_magnifications,
        batch_size=GPU_BATCH_SIZE,
        chunk_size=256,
    threads: embed_threads
    resources:
        gpu=embed_gpus,
        mem_mb=cell_features_mem_mb,
        runtime=cell_features_runtime,
        constraint=gpu_constraint,
    group:
        "cell_features_{encoder}"
    conda:
        "../envs/embed.yaml"
    script:
        "../scripts/cell_features.py"


# The merge of one encoder's feature folders at one magnification: checks that every folder was computed from
# the section's current manifest, and lists folders and manifests for the shards (cheap; a local rule).
rule cell_feature_set:
    input:
        unpack(cell_feature_set_inputs),
    output:
        f"{CELLS}/features/{{encoder}}/{{key}}/{{magnification}}x.json",
    log:
        f"{RESULTS}/logs/cell_feature_set/{{encoder}}/{{key}}/{{magnification}}x.log",
    params:
        sections=cell_sections,
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/cell_feature_set.py"


# One (encoder, magnification, protocol): every taxonomy x readout x seed x unit of it in-process, on the
# batched probe engine (GPU when the job has one), reading features through their memory maps.
rule cell_shard:
    input:
        unpack(cell_shard_inputs),
        validated=validated_cells(),
    output:
        f"{RESULTS}/shards/cells/{{protocol}}/{{encoder}}/{{magnification}}x.parquet",
    log:
        f"{RESULTS}/logs/cell_shard/{{protocol}}/{{encoder}}/{{magnification}}x.log",
    benchmark:
        f"{RESULTS}/benchmarks/cell_shard/{{protocol}}/{{encoder}}/{{magnification}}x.tsv"
    params:
        cells=cell_shard_settings,
        taxonomy_tasks=cell_taxonomy_tasks,
    threads: 1
    resources:
        mem_mb=shard_mem_mb,
        runtime=shard_runtime,
    group:
        "cell_shard_{encoder}"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/cell_shard.py"


rule aggregate_cells:
    input:
        shards=all_cell_shards,
    output:
        CELL_RUNS,
    log:
        f"{RESULTS}/logs/aggregate_cells.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/aggregate_cells.py"
