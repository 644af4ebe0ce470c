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
    wildcard_constraints:
        dataset=SOURCE_DATASET,
    conda:
        "../envs/slides.yaml"
    script:
        "../scripts/prepare_manifest.py"


# Downloads are explicit targets (`snakemake download`), never implied by preparation: on clusters the data
# usually lie in a shared data_root already, and a download must not start because a file's date changed.
rule download_dataset:
    output:
        f"{RESULTS}/downloads/{{dataset}}.done",
    log:
        f"{RESULTS}/logs/download_dataset/{{dataset}}.log",
    params:
        entry=dataset_entry,
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
