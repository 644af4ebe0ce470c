# Embeddings: one job per (encoder, data set), on a GPU for real encoders; resumable in chunks. Only once every
# task's splits passed validation. The {key} folder is the hash of what decides the numbers (EMBEDDING_KEY in
# common.smk): a new key writes beside the earlier embeddings instead of replacing them. Read embeddings through
# embedding_path(encoder, dataset).


rule embed:
    input:
        manifest=f"{RESULTS}/manifests/{{dataset}}.parquet",
        validated=validated_splits(),
    output:
        f"{RESULTS}/embeddings/{{encoder}}/{{key}}/{{dataset}}.npz",
    log:
        f"{RESULTS}/logs/embed/{{encoder}}/{{key}}/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/embed/{{encoder}}/{{key}}/{{dataset}}.tsv"
    params:
        encoder=encoder_entry,
        weights=encoder_weights,
        batch_size=64,
    threads: embed_threads
    resources:
        gpu=embed_gpus,
        mem_mb=embed_mem_mb,
        runtime=embed_runtime,
    conda:
        "../envs/embed.yaml"
    script:
        "../scripts/embed.py"


# Embeddings computed elsewhere (a data set of kind `features`: an HDF5 or npz file per encoder) enter here, in
# place of an embedding job: the file's features of the manifest's items, written as that encoder's embeddings
# (same path, same format), so every analysis reads them as it reads computed ones. Cheap: a local rule. Its
# data-set wildcard matches the features data sets only, and where both rules could write a file it is this one.
ruleorder: import_features > embed


rule import_features:
    input:
        manifest=f"{RESULTS}/manifests/{{dataset}}.parquet",
        features=imported_features_file,
        validated=validated_splits(),
    output:
        f"{RESULTS}/embeddings/{{encoder}}/{{key}}/{{dataset}}.npz",
    log:
        f"{RESULTS}/logs/import_features/{{encoder}}/{{key}}/{{dataset}}.log",
    params:
        encoder=imported_encoder_entry,
        source=imported_features_source,
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    wildcard_constraints:
        dataset=FEATURES_DATASET,
    conda:
        "../envs/slides.yaml"
    script:
        "../scripts/import_features.py"
