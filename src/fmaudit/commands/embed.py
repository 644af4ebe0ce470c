"""``fmaudit embed``: one encoder over a sheet or a folder of images, outside the workflow, into the HDF5 file
``fmaudit probe`` reads.

    fmaudit embed --encoder uni --images tiles.csv --out uni.h5
    fmaudit embed --encoder timm:1aurent/vit_small_patch8_224.lunit_dino --images tiles/ --out lunit.h5
    fmaudit embed --encoder my_finetune.safetensors --architecture uni --images tiles.csv --out mine.h5

The encoder is a registry slug, a hub name (``timm:<org>/<repo>``, ``hf:<org>/<repo>``, resolved from the local
Hugging Face cache) or a checkpoint file with ``--architecture``. Images: a CSV/TSV sheet with a ``path`` column
(paths relative to the sheet; optional ``item_id``) or a folder (:func:`fmaudit.embed.image_manifest`). Before
anything is computed it runs the encoder's pre-flight (its hub config, the weights' sha256, their keys and shapes
against the architecture: :func:`fmaudit.encoders.checks.check_encoder_before_embedding`), then the workflow's own
embedding job (:func:`fmaudit.jobs.embed.embed_job`): resumable in chunks (run the same command again after an
interruption and finished chunks are reused), written atomically. The file holds ``features`` (the encoder's
default readout, or ``--features-readout``), ``item_id``, every readout under ``readouts/<name>`` and the
provenance as JSON in its ``provenance`` attribute; an ``.npz`` path gives the workflow's layout instead.
"""

from __future__ import annotations

import argparse

from fmaudit.commands import words
from fmaudit.config import encoder_from_reference, schema_default
from fmaudit.io import FmauditInputError
from fmaudit.jobs.embed import embed_job
from fmaudit.registry import check_encoder_usable, embedding_spec, load_registry

__all__ = ["register", "run"]


def run(args: argparse.Namespace) -> int:
    """Run ``fmaudit embed``: the encoder's pre-flight, then the resumable embedding job into ``--out``.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options of :func:`register` (``encoder``, ``architecture``, ``weights``, ``images``, ``out``,
        ``readouts``, ``features_readout``, ``batch_size``, ``chunk_size``, ``threads``, ``device``, ``log``,
        ``overwrite``, ``encoder_registry``).

    Returns
    -------
    int
        Exit status 0 once the file is written.

    Raises
    ------
    FmauditInputError
        When ``--weights`` is given for an encoder that is already a checkpoint file, the encoder is not usable,
        or its pre-flight fails (hub config, sha256, keys and shapes).
    """
    # torch and the model libraries load only when the command runs, not with every `fmaudit` command
    from fmaudit.embed import image_manifest
    from fmaudit.encoders import check_encoder_before_embedding

    registry = load_registry(args.encoder_registry)
    slug, entry, override = encoder_from_reference(args.encoder, registry, args.architecture)
    if args.weights and override:
        raise FmauditInputError("--weights: the encoder is already a checkpoint file; give one or the other")
    override = args.weights or override
    check_encoder_usable(slug, entry)
    check_encoder_before_embedding(slug, entry, override=override,
                                   override_key="--weights" if args.weights else "--encoder")
    manifest = image_manifest(args.images)
    readouts = args.readouts or entry["readouts"]
    default = entry.get("default_readout") if entry.get("default_readout") in readouts else readouts[0]
    prov = embed_job(slug, embedding_spec({**entry, "name": slug}), manifest, args.out, weights=override,
                     batch_size=args.batch_size, threads=args.threads, log=args.log, chunk_size=args.chunk_size,
                     readouts=readouts, features_readout=args.features_readout or default, overwrite=args.overwrite,
                     device=args.device)
    dims = ", ".join(f"{r} ({d})" for r, d in prov["embed_dim"].items())
    print(f"{args.out}: {prov['n_items']} items embedded by {slug} (readouts {dims}; features = "
          f"{prov.get('features_readout') or 'see readouts'})")
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``embed`` to the ``fmaudit`` command line.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The sub-parsers of :func:`fmaudit.cli.build_parser`.

    Returns
    -------
    argparse.ArgumentParser
        The ``embed`` parser, its ``func`` set to :func:`run`.
    """
    em = subparsers.add_parser("embed", help="embed a sheet or folder of images with one encoder into an HDF5 "
                               "file (outside the workflow, resumable)")
    em.add_argument("--encoder", required=True, help="registry slug, timm:<org>/<repo>, hf:<org>/<repo>, or a "
                    "checkpoint file (with --architecture)")
    em.add_argument("--architecture", help="for a checkpoint file: the registry slug or hub name whose "
                    "architecture and preprocessing it fits")
    em.add_argument("--weights", help="a local weight file replacing the encoder's own (as encoder_weights)")
    em.add_argument("--images", required=True, help="CSV/TSV sheet with a 'path' column, or a folder of images")
    em.add_argument("--out", required=True, help="output file: .h5 (features + item_id), or .npz")
    em.add_argument("--encoder-registry", default=schema_default("encoder_registry"),
                    help="encoder registry (default %(default)s)")
    em.add_argument("--readouts", type=words, help="readouts to write, comma-separated (default: the entry's)")
    em.add_argument("--features-readout", help="the readout stored as 'features' (default: the entry's default)")
    em.add_argument("--batch-size", type=int, default=64)
    em.add_argument("--chunk-size", type=int, default=256, help="items per resumable chunk (default %(default)s)")
    em.add_argument("--threads", type=int, default=1, help="torch threads (and data-loader workers on a GPU)")
    em.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default %(default)s)")
    em.add_argument("--log", help="log file (default: the log goes to stderr)")
    em.add_argument("--overwrite", action="store_true",
                    help="replace an existing output made with other settings (refused otherwise)")
    em.set_defaults(func=run)
    return em
