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
