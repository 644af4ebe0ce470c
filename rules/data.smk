# Data sets -> manifests (one table per data set: item, label, group, domain, split).


rule prepare_manifest:
    input:
        dataset_input_files,
    output:
        f"{RESULTS}/manifests/{{dataset}}.parquet",
    log:
        f"{RESULTS}/logs/prepare_manifest/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/prepare_manifest/{{dataset}}.tsv"
    params:
        entry=dataset_entry,
        data_root=config["data_root"],
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    conda:
        "../envs/slides.yaml"
    script:
        "../scripts/prepare_manifest.py"


# Every split check of every tile-level task (fmaudit.validation.validate_task_splits), once all manifests are
# prepared and before any embedding: groups on two splits, classes evaluated but absent from training, label
# ranges, single-class training splits, duplicate ids and files. The report lists each check; a problem stops
# the run here, naming the manifest, the group and both splits or the class. Also a target of its own:
# `snakemake validate` prepares the manifests and checks them without embedding anything.
rule validate:
    input:
        list(VALIDATION_MANIFESTS.values()),
    output:
        VALIDATION,
    log:
        f"{RESULTS}/logs/validate.log",
    params:
        manifests=VALIDATION_MANIFESTS,
        tasks=VALIDATION_TASKS,
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/validate.py"


# Downloads are explicit targets (`snakemake download`), never implied by preparation: on clusters the data
# usually lie in a shared data_root already, and a download must not start because a file's date changed.
rule download_dataset:
    output:
        f"{RESULTS}/downloads/{{dataset}}.done",
    log:
        f"{RESULTS}/logs/download_dataset/{{dataset}}.log",
    params:
        entry=download_entry,
        data_root=config["data_root"],
    threads: 1
    resources:
        mem_mb=2000,
        runtime=1440,
    conda:
        "../envs/slides.yaml"
    script:
        "../scripts/download_dataset.py"


rule download:
    input:
        downloadable_datasets,
