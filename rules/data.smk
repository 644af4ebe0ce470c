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


# The data stage of the pre-flight (fmaudit.preflight.check_data), once all manifests are prepared and before
# any embedding: every split check of every tile-level task (groups on two splits, classes evaluated but absent
# from training, label ranges, single-class training splits, duplicate ids and files) and every class name the
# config mentions (ood.near, ood.artefact, priors ...), and whether the files can be read (every image header,
# a full decode of a seeded sample, every slide opened with openslide: the slides environment); test splits with
# fewer than 5 groups are warnings. The report lists each check; a problem stops the run here, naming the
# manifest, the config key, the group and both splits, the class, or the file and its sheet line. Also a target:
# `snakemake validate` prepares the manifests and checks them without embedding anything.
rule validate:
    input:
        DATA_CHECKS.inputs,
    output:
        VALIDATION,
    log:
        f"{RESULTS}/logs/validate.log",
    params:
        checks=canonical(DATA_CHECKS.as_params()),
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        "../envs/slides.yaml"
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
