# Helpers of rules/embed.smk: the encoder of an embedding job and what decides its numbers. The key and path of
# every embedding (EMBEDDING_KEY, embedding_path) and the encoder jobs' resources are in rules/common.smk.

from fmaudit.grid import embed_pairs
from fmaudit.io import FmauditInputError
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
            f"ask for {embedding_path(encoder, wildcards.dataset)}")
    return encoder


def encoder_entry(wildcards):
    """What decides an encoder's embeddings (fmaudit.registry.embedding_spec): a change to it (a new key) embeds
    again; descriptive keys (description, licence, exposure, pretraining corpora ...) are left out."""
    return canonical(embedding_spec(ENCODERS[embed_encoder(wildcards)]))


def encoder_weights(wildcards):
    """A local checkpoint that overrides the registry's weight source ('' for none)."""
    return weights_override(embed_encoder(wildcards))


def all_embeddings():
    return [embedding_path(enc, ds) for enc, ds in embed_pairs(config)]


# the embeddings chapter lists every embedding file with its provenance
REPORT_INPUTS["embeddings"] = all_embeddings()


record_signatures(globals())
