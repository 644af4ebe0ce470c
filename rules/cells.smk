# The cell branch (CellPath-Bench, seed 002): Xenium sections registered to their H&E (or the slides of a
# cell_table: the user's own cells, fmaudit.cells.table), checked, embedded at
# their nuclei per (encoder, section, magnification), probed per (encoder, magnification, protocol) shard,
# aggregated for the report. Planned from CELL_PLAN (rules/common.smk, fmaudit.grid.cell_plan); nothing here
# when the config has no `cells` section.


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
        mem_mb=8000,
        runtime=60,
    conda:
        "../envs/slides.yaml"
    script:
        "../scripts/prepare_cell_section.py"


# Every check of the panel that can fail on cell data (fmaudit.split_checks.validate_cell_panel), once every
# section is prepared and before the first feature job: excluded sections, leakage, two classes in training,
# every test class in training (or allowed by name in the taxonomy task's allow_missing_classes).
rule validate_cells:
    input:
        manifests=lambda wildcards: [cell_manifest_path(s) for s in sorted(CELL_PLAN.sections)],
    output:
        CELL_VALIDATION,
    log:
        f"{RESULTS}/logs/validate_cells.log",
    params:
        sections=lambda wildcards: sorted(CELL_PLAN.sections),
        cells=lambda wildcards: cell_validation_settings(),
        taxonomies=lambda wildcards: cell_taxonomies(),
    threads: 1
    resources:
        mem_mb=8000,
        runtime=60,
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/validate_cells.py"


# Nucleus-anchored features of one (encoder, section, magnification): a GPU job for real encoders, resumable
# in chunks; under the encoder's embedding key like the tile embeddings.
rule cell_features:
    input:
        manifest=f"{CELLS}/sections/{{section}}.parquet",
        validated=validated_cells(),
    output:
        directory(f"{CELLS}/features/{{encoder}}/{{key}}/{{magnification}}x/{{section}}"),
    log:
        f"{RESULTS}/logs/cell_features/{{encoder}}/{{key}}/{{magnification}}x/{{section}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/cell_features/{{encoder}}/{{key}}/{{magnification}}x/{{section}}.tsv"
    params:
        encoder=cell_encoder_entry,
        weights=cell_encoder_weights,
        batch_size=64,
        chunk_size=256,
    threads: embed_threads
    resources:
        gpu=embed_gpus,
        mem_mb=embed_mem_mb,
        runtime=embed_runtime,
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
        sections=lambda wildcards: sorted(CELL_PLAN.sections),
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
        taxonomy_tasks=lambda wildcards: sorted(set(CELL_PLAN.taxonomy_tasks.values())),
    threads: 1
    resources:
        mem_mb=shard_mem_mb,
        runtime=shard_runtime,
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/cell_shard.py"


rule aggregate_cells:
    input:
        shards=lambda wildcards: all_cell_shards(),
    output:
        CELL_RUNS,
    log:
        f"{RESULTS}/logs/aggregate_cells.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/aggregate_cells.py"
