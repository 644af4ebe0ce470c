# Helpers of rules/embed.smk: the encoder of an embedding job, what decides its numbers and what it asks of a
# cluster. The key and path of every embedding (EMBEDDING_KEY, embedding_path) and the request planner (PLANNER)
# are in rules/common.smk.

import re

from fmaudit.grid import embed_pairs
from fmaudit.io import FmauditInputError
from fmaudit.preflight import feature_imports
from fmaudit.registry import embedding_spec


def embed_encoder(wildcards):
    """The encoder of an embedding job, checked against the config and the key in the requested path."""
    encoder = config_name("encoder", wildcards.encoder, "encoders")
    # a derived data set (OOD perturbations: DERIVED, rules/ood_helpers.smk) is named by its plan, not the config
    if wildcards.dataset not in DERIVED:
        config_name("dataset", wildcards.dataset, "datasets")
    if wildcards.key != EMBEDDING_KEY[encoder]:
        raise FmauditInputError(
            f"embeddings of {encoder!r} with key {wildcards.key} were asked for, but the config gives encoder "
            f"{encoder!r} the key {EMBEDDING_KEY[encoder]} (its registry entry or config 'encoder_weights' changed); "
            f"ask for {embedding_path(encoder, wildcards.dataset)}"
        )
    return encoder


def encoder_entry(wildcards):
    """What decides an encoder's embeddings (fmaudit.registry.embedding_spec): a change to it (a new key) embeds
    again; descriptive keys (description, licence, exposure, pretraining corpora ...) are left out."""
    return canonical(embedding_spec(ENCODERS[embed_encoder(wildcards)]))


def encoder_weights(wildcards):
    """A local checkpoint that overrides the registry's weight source ('' for none)."""
    return weights_override(embed_encoder(wildcards))


def source_manifest(dataset):
    """The manifest of a derived copy's source data set (the OOD perturbations: DERIVED, rules/ood_helpers.smk),
    whose rows bound the copy's before it is derived; None for a data set of the config."""
    derived = DERIVED.get(dataset)
    return manifest_path(derived["dataset"]) if derived else None


def embed_request(wildcards, input, threads):
    """What an embedding job asks for at attempt 1 (fmaudit.cluster.RequestPlanner.embed): from the encoder and
    the manifest's rows, or the earlier run's benchmark files of this encoder."""
    return PLANNER.embed(wildcards.encoder, input.manifest, threads, fallback=source_manifest(wildcards.dataset))


def embed_mem_mb(wildcards, input, threads, attempt):
    return embed_request(wildcards, input, threads).at(attempt)[0]


def embed_runtime(wildcards, input, threads, attempt):
    return embed_request(wildcards, input, threads).at(attempt)[1]


def all_embeddings():
    return [embedding_path(enc, ds) for enc, ds in embed_pairs(config)]


# the embeddings chapter lists every embedding file with its provenance
REPORT_INPUTS["embeddings"] = all_embeddings()

# Embeddings computed elsewhere ({(encoder, data set): file, keys, readout} of the config's `features` data sets):
# the import_features rule writes them where the embed rule would (it matches only these data sets, and takes
# precedence: ruleorder in rules/embed.smk), so no embedding job runs for them.
FEATURE_IMPORTS = feature_imports(config, DATASETS)
FEATURE_DATASETS = sorted({ds for _, ds in FEATURE_IMPORTS})
FEATURES_DATASET = "|".join(map(re.escape, FEATURE_DATASETS)) if FEATURE_DATASETS else r"(?!)"


def imported_source(wildcards):
    """What import_features reads for this (encoder, data set), checked against the config and the path's key."""
    encoder = config_name("encoder", wildcards.encoder, "encoders")
    if (encoder, wildcards.dataset) not in FEATURE_IMPORTS:
        raise WorkflowError(
            f"data set {wildcards.dataset!r} has no feature file of encoder {encoder!r} "
            f"(dataset_entries.{wildcards.dataset}.params.files)"
        )
    if wildcards.key != EMBEDDING_KEY[encoder]:
        raise FmauditInputError(
            f"embeddings of {encoder!r} with key {wildcards.key} were asked for; the config gives "
            f"it the key {EMBEDDING_KEY[encoder]}"
        )
    return FEATURE_IMPORTS[(encoder, wildcards.dataset)]


def imported_features_file(wildcards):
    return imported_source(wildcards)["file"]


def imported_features_source(wildcards):
    return canonical(imported_source(wildcards))


def imported_encoder_entry(wildcards):
    """The encoder entry the imported embeddings are filed under (its number-deciding keys, as embed_encoder)."""
    imported_source(wildcards)
    return canonical(embedding_spec(ENCODERS[wildcards.encoder]))


record_signatures(globals())
