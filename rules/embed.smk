# Embeddings: one job per (encoder, data set), on a GPU for real encoders; resumable in chunks.


rule embed:
    input:
        manifest=f"{RESULTS}/manifests/{{dataset}}.parquet",
    output:
        f"{RESULTS}/embeddings/{{encoder}}/{{dataset}}.npz",
    log:
        f"{RESULTS}/logs/embed/{{encoder}}/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/embed/{{encoder}}/{{dataset}}.tsv"
    params:
        encoder=encoder_entry,
        weights=encoder_weights,
        batch_size=64,
    threads: 2
    resources:
        gpu=embed_gpus,
        mem_mb=embed_mem_mb,
        runtime=embed_runtime,
    conda:
        "../envs/embed.yaml"
    script:
        "../scripts/embed.py"
