"""Pre-flight: every check that a config or its data can fail, run before the first GPU hour is spent.

One home for both faces: the workflow (``rules/common.smk`` when it plans, the ``validate`` rule before any
embedding job) and ``fmaudit check-config`` call exactly these functions, so a mistake that the command line
accepts is one the workflow accepts too, and the reverse. Two stages:

- :func:`check_config`, at plan time (every ``snakemake -n``, every ``fmaudit grid``): the config and its
  registries (the built-in ones extended by the config's own, :func:`fmaudit.registry.load_encoder_registries`)
  against their schemas, every name the config uses (encoders, data sets, kinds, preparers), every analysis
  grid, slide sheets, local weight files, and the sheets of the user's own data sets (:func:`check_own_data`:
  every bad line of an ``image_table``, ``slide_table``, ``cell_table`` or ``features`` sheet, a class outside
  the entry's classes, an empty label, a missing file, an annotated region of an unknown class, an item missing
  from a feature file), and the encoders' pre-flight (:func:`check_encoders_before_embedding`: each entry against
  its hub repo's cached config, the sha256 of local weight files, their keys and shapes against the architecture
  on the meta device, recorded so that an unchanged encoder is checked once). Cheap for the data: it reads
  sheets and the headers of feature files, and stats the files a sheet lists, never an image.
  :func:`unusable_encoders` says which encoders could not be embedded as configured
  (remote code without a pinned commit, a registry weight file that is not there); the workflow warns when it
  plans and stops before the first job of a run that would embed one.
- :func:`check_data`, once the manifests are prepared (the ``validate`` rule; ``fmaudit check-config`` on the
  manifests already prepared): every split check of every tile-level task (:mod:`fmaudit.split_checks`:
  leakage across splits, classes missing from training, label ranges, duplicate ids and files) and every class
  name the config mentions (:func:`class_references`: ``ood.near``, ``ood.artefact``, ``ood.coarsening.without``,
  prior-shift priors, ``allow_missing_classes``) against the classes of its task's manifests; whether the files
  can be read (:mod:`fmaudit.datasets.files`: every image header, a full decode of a seeded sample of
  ``preflight.decode_sample`` images, every slide opened with openslide); and, as warnings, test splits with
  fewer than :data:`MIN_TEST_GROUPS` groups (below 2 no interval exists: the report gives none). It collects every
  problem of every check and raises one :class:`~fmaudit.split_checks.SplitValidationError` listing them all,
  each naming the file, the config key, the group or the class; otherwise it returns the report of every check
  (``results/<study>/validation/preflight.tsv`` in the workflow).

What :func:`check_data` checks is described by a :class:`DataChecks`, which :func:`data_checks` builds from a
config: the workflow passes it to the ``validate`` rule as params (:meth:`DataChecks.as_params`), so editing a
class name of ``ood.near`` reruns the checks, and ``fmaudit check-config`` builds the same object.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
from huggingface_hub import try_to_load_from_cache

from fmaudit.cells.table import check_cell_table
from fmaudit.claims import load_claims
from fmaudit.config import (
    add_hub_encoders,
    apply_encoder_revisions,
    dataset_params,
    embedded_encoders,
    manifest_file,
    results_dir,
    weights_override,
)
from fmaudit.datasets import preparer_names
from fmaudit.datasets.files import check_image_decode, check_image_headers, check_slides
from fmaudit.datasets.own import (
    feature_encoders,
    precomputed_encoders,
    read_feature_table,
    read_image_table,
    read_slide_table,
)
from fmaudit.datasets.slide_tiles import read_slide_sheet
from fmaudit.grid import (
    check_grid,
    derived_datasets,
    embed_pairs,
    parts_with,
    resolved_tile_tasks,
    study_parts,
)
from fmaudit.io import FmauditInputError, read_json, read_table, stable_hash, write_json
from fmaudit.registry import (
    check_encoder_usable,
    embedding_spec,
    load_dataset_registries,
    load_encoder_registries,
    unknown_name_error,
)
from fmaudit.split_checks import SPLIT_COLUMNS, SplitValidationError, SplitValidationReport, validate_task_splits

__all__ = [
    "FILE_CHECKS",
    "MIN_TEST_GROUPS",
    "ClassReference",
    "DataChecks",
    "check_class_references",
    "check_config",
    "check_data",
    "check_encoder_weights",
    "check_encoders_before_embedding",
    "check_feature_imports",
    "check_names",
    "check_own_data",
    "check_preparers",
    "check_slide_sheets",
    "check_test_groups",
    "class_references",
    "data_checks",
    "feature_imports",
    "registries",
    "unusable_encoders",
]

#: Test groups (patients, slides) per domain below which the validation log and the report warn: the interval
#: of a metric over so few clusters is wide and its own width uncertain. Below 2 there is no interval at all.
MIN_TEST_GROUPS = 5
#: The checks that read the files of a manifest (:func:`check_files`).
FILE_CHECKS = ("image_headers", "image_decode", "slides")


# ---------------------------------------------------------------------------------------------- plan stage


def check_names(config: Mapping[str, Any], encoder_registry: Mapping[str, Any],
                dataset_registry: Mapping[str, Any]) -> None:
    """Every encoder, data set and task reference of the config exists; raise naming the first that doesn't."""
    for enc in config["encoders"]:
        if enc not in encoder_registry:
            raise unknown_name_error("encoder", enc, list(encoder_registry), "config 'encoders'")
    for ds in config["datasets"]:
        if ds not in dataset_registry:
            raise unknown_name_error("dataset", ds, list(dataset_registry), "config 'datasets'")
    declared = [name for name, entry in encoder_registry.items() if entry.get("variant_of")]
    for variant in config["variants"]:
        if variant not in declared:
            raise unknown_name_error("declared encoder variant", variant, declared, "config 'variants'")
        base = encoder_registry[variant]["variant_of"]
        if base not in config["encoders"]:
            raise FmauditInputError(f"config 'variants': {variant!r} is a variant of {base!r}, which is not in the "
                                    f"config's encoders ({', '.join(config['encoders'])}); a variant is checked "
                                    "beside its base")
    for ds in config["dataset_params"]:
        if ds not in config["datasets"]:
            raise unknown_name_error("dataset", ds, list(config["datasets"]), "config 'dataset_params'")
    for key in ("encoder_weights", "encoder_revisions"):
        for enc in config[key]:
            if enc not in config["encoders"]:
                raise unknown_name_error("encoder", enc, list(config["encoders"]), f"config '{key}'")
    for task, spec in config["tasks"].items():
        for ds in spec["datasets"]:
            if ds not in config["datasets"]:
                raise unknown_name_error("dataset", ds, list(config["datasets"]), f"config 'tasks.{task}.datasets'")


def check_preparers(config: Mapping[str, Any], dataset_registry: Mapping[str, Any]) -> None:
    """Every data set of the config names a registered preparer (own-data kinds: the kind's own); the error names
    the data set and its registry entry's key, at plan time rather than in the prepare job."""
    known = preparer_names()
    for ds in config["datasets"]:
        preparer = dataset_registry[ds]["preparer"]
        if preparer not in known:
            raise unknown_name_error("preparer", preparer, known, f"data set {ds!r} (its registry entry's 'preparer')")


def check_own_data(config: Mapping[str, Any], dataset_registry: Mapping[str, Any]) -> dict[str, list[str]]:
    """The sheets of every own-data set of the config (``image_table``, ``slide_table``, ``cell_table``,
    ``features``): every bad line named (:mod:`fmaudit.datasets.own`, :mod:`fmaudit.cells.table`), before any
    job runs; no image is read. Returns each tile-level one's domains, as its sheet lists them."""
    organ_of = {s: organ for _, _, cells in parts_with(config, "cells")
                for organ, secs in cells["sections"].items() for s in secs}
    domains: dict[str, list[str]] = {}
    for ds in config["datasets"]:
        kind = dataset_registry[ds]["kind"]
        params = dataset_params(config, dataset_registry, ds)
        rows = None
        if kind == "image_table":
            rows = read_image_table(ds, params)
        elif kind == "slide_table":
            rows = read_slide_table(ds, params)
        elif kind == "features":
            rows = read_feature_table(ds, params)
        elif kind == "cell_table":
            check_cell_table(ds, params, organ_of, where=f"data set {ds!r}: ")
        if rows is not None:
            domains[ds] = sorted(str(d) for d in rows["domain"].dropna().unique())
    return domains


def feature_imports(config: Mapping[str, Any], dataset_registry: Mapping[str, Any]) -> dict[tuple[str, str], Any]:
    """``{(encoder, data set): file, features_key, ids_key, readout}`` of every ``features`` data set of the
    config (:func:`fmaudit.datasets.own.feature_encoders`): the embeddings the workflow imports instead of
    computing."""
    known = [ds for ds in config["datasets"] if ds in dataset_registry]
    return feature_encoders(known, dataset_registry,
                            {ds: dataset_params(config, dataset_registry, ds) for ds in known
                             if dataset_registry[ds]["kind"] == "features"})


def check_feature_imports(config: Mapping[str, Any], dataset_registry: Mapping[str, Any],
                          encoder_registry: Mapping[str, Any], imports: Mapping[tuple[str, str], Any]) -> None:
    """Embeddings computed elsewhere stand in for an embedding job, so: every (encoder, data set) pair the config
    embeds whose data set is a ``features`` one has a file of that encoder; no OOD tier perturbs the images of
    such a data set (it has none); an encoder known only by its feature files (``loader: precomputed``) embeds
    no other data set and no cell."""
    features = {ds for ds in config["datasets"] if dataset_registry[ds]["kind"] == "features"}
    for encoder, ds in embed_pairs(config):
        if ds in features and (encoder, ds) not in imports:
            have = sorted(e for e, d in imports if d == ds)
            raise FmauditInputError(
                f"data set {ds!r} holds embeddings computed elsewhere (kind: features, files of {', '.join(have)}), "
                f"but the config also asks encoder {encoder!r} to embed it: add its file under "
                f"dataset_entries.{ds}.params.files.{encoder}, or run {encoder!r} in a study without {ds!r} "
                "(config 'studies')")
        if encoder_registry[encoder].get("loader") == "precomputed" and (encoder, ds) not in imports:
            known = ", ".join(d for e, d in imports if e == encoder)
            raise FmauditInputError(
                f"encoder {encoder!r} is known only by its feature files ({known}), so it cannot embed data set "
                f"{ds!r}: give its features of {ds!r} too, or a registry entry that loads its weights")
    for derived in derived_datasets(config).values():
        if derived["dataset"] in features:
            raise FmauditInputError(
                f"config 'ood': the {derived['tag']} condition re-embeds perturbed images of data set "
                f"{derived['dataset']!r}, which holds embeddings computed elsewhere (kind: features) and no images; "
                "keep its task out of ood.blur and ood.image_artefact")
    for _, part, _cells in parts_with(config, "cells"):
        for encoder in part["encoders"]:
            if encoder_registry[encoder].get("loader") == "precomputed":
                raise FmauditInputError(f"config 'cells': encoder {encoder!r} is known only by its feature files and "
                                        "cannot extract cell features; give it a registry entry that loads its weights")


def check_slide_sheets(config: Mapping[str, Any], dataset_registry: Mapping[str, Any]) -> None:
    """Validate every slide sheet the config's data sets use, so a bad sheet stops the run before any job."""
    for ds in config["datasets"]:
        if dataset_registry[ds]["preparer"] != "slide_tiles":
            continue  # (a cell_table's `slides` is a sheet of its own kind, checked with it)
        sheet = dataset_params(config, dataset_registry, ds).get("slides")
        if sheet:
            read_slide_sheet(sheet)


def check_encoder_weights(config: Mapping[str, Any]) -> None:
    """Every ``encoder_weights.<slug>`` override of the config is an existing file; the error names the key."""
    for enc, path in config["encoder_weights"].items():
        where = "" if Path(path).is_absolute() else f" (relative to {Path.cwd()})"
        if not Path(path).exists():
            raise FmauditInputError(f"config 'encoder_weights.{enc}': weight file {path} does not exist{where}")
        if not Path(path).is_file():
            raise FmauditInputError(f"config 'encoder_weights.{enc}': {path} is not a file{where}")


def unusable_encoders(config: Mapping[str, Any], encoder_registry: Mapping[str, Any],
                      encoders: list[str] | None = None) -> dict[str, str]:
    """``{slug: why}`` for the config's encoders (or ``encoders``) that cannot be embedded as the registry and the
    config stand, each message naming the key to set: remote code without a pinned commit
    (:func:`fmaudit.registry.check_encoder_usable`; ``encoder_revisions.<slug>``), or a registry weight file
    (``source: file``) that is not there and no ``encoder_weights.<slug>`` override."""
    files = config["encoder_registry"]
    registry_file = ", ".join(files) if isinstance(files, list) else str(files)
    problems = {}
    for enc in config["encoders"] if encoders is None else encoders:
        entry = encoder_registry[enc]
        try:
            check_encoder_usable(enc, entry, source=registry_file, config_key=f"encoder_revisions.{enc}")
        except FmauditInputError as e:
            problems[enc] = str(e)
            continue
        weights = entry["weights"]
        if weights["source"] == "file" and enc not in config["encoder_weights"] and not Path(weights["path"]).is_file():
            problems[enc] = (f"{registry_file}: encoder {enc!r}: weight file {weights['path']} (weights.path) does not "
                             f"exist (relative to {Path.cwd()}); give a local copy in the config's "
                             f"'encoder_weights.{enc}', or fix weights.path")
    return problems


# config files of a hub repo the pre-flight compares an entry with (fmaudit.encoders.hub)
_HUB_CONFIG_FILES = ("config.json", "preprocessor_config.json", "open_clip_config.json")


def _preflight_inputs(spec: Mapping[str, Any], override: str | None) -> list[list[Any]]:
    """What the pre-flight of an entry would read on this machine now: local weight files and cached hub config
    files, each ``[path, size, mtime_ns]``; cheap (no torch), so an unchanged encoder is not checked twice."""
    weights = spec["weights"]
    paths = []
    if override:
        paths.append(override)
    elif weights["source"] == "file":
        paths.append(weights["path"])
    if weights["source"] == "hf_hub":
        # the cache the embedding job reads (fmaudit.encoders.weights), from the environment as it is now
        cache = os.environ.get("HF_HUB_CACHE") or (os.path.join(os.environ["HF_HOME"], "hub")
                                                   if os.environ.get("HF_HOME") else None)
        default = "model.safetensors" if weights["format"] == "safetensors" else "pytorch_model.bin"
        names = list(_HUB_CONFIG_FILES) + ([] if override else [weights.get("filename") or default])
        for filename in names:
            hit = try_to_load_from_cache(weights["hf_hub_id"], filename, cache_dir=cache,
                                         revision=weights.get("revision"))
            if isinstance(hit, str):
                paths.append(hit)
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        out.append([str(path), st.st_size, st.st_mtime_ns])
    return out


def check_encoders_before_embedding(config: Mapping[str, Any], encoder_registry: Mapping[str, Any]) -> dict[str, Any]:
    """The pre-flight of every encoder the config embeds
    (:func:`fmaudit.encoders.checks.check_encoder_before_embedding`: the entry against its hub repo's cached
    config, the sha256 of local weight files, their keys and shapes against the architecture on the meta device);
    raise one error listing every failure.

    Each encoder that passed is recorded in ``results/<study>/validation/encoders/<slug>.json`` with what was read
    (files with their size and modification time); while none of it changes, the checks are not run again, so a
    dry run or a job's own parse of the workflow pays them once. Returns ``{slug: record}`` of the encoders
    checked now."""
    registry_file = str(config["encoder_registry"])
    todo = {}
    for enc in embedded_encoders(config):
        spec = encoder_registry[enc]
        override = weights_override(config, encoder_registry, enc)
        inputs = _preflight_inputs(spec, override)
        if not inputs:  # random init, or nothing on this machine yet: the embedding job checks what it downloads
            continue
        key = stable_hash({"spec": embedding_spec(spec), "override": override, "inputs": inputs})
        record_path = Path(results_dir(config)) / "validation" / "encoders" / f"{enc}.json"
        try:
            if read_json(record_path).get("key") == key:
                continue
        except (OSError, ValueError):
            pass
        todo[enc] = (spec, override, key, record_path)
    if not todo:
        return {}
    # torch, timm, transformers and open_clip are imported only when there are weights or hub configs to check
    from fmaudit.encoders.checks import check_encoder_before_embedding

    problems, records = [], {}
    for enc, (spec, override, key, record_path) in todo.items():
        try:
            record = check_encoder_before_embedding(enc, spec, override=override,
                                                    override_key=f"encoder_weights.{enc}", source=registry_file)
        except FmauditInputError as e:
            problems.append(str(e))
            continue
        records[enc] = record.as_dict()
        write_json(record_path, {"key": key, **records[enc]})
    if problems:
        raise FmauditInputError("pre-flight of the encoders failed, before any embedding job:\n"
                                + "\n".join(f"  - {p}" for p in problems))
    return records


def registries(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (encoder, data-set) registries of a filled config: the built-in ones extended by the config's own
    files and inline entries (:func:`fmaudit.registry.load_encoder_registries`), with the encoders known only by
    feature files (``features`` data sets, :func:`fmaudit.datasets.own.precomputed_encoders`) added."""
    encoders = add_hub_encoders(config, load_encoder_registries(config["encoder_registry"], config["encoder_entries"]))
    datasets = load_dataset_registries(config["dataset_registry"], config["dataset_entries"])
    encoders.update(precomputed_encoders(feature_imports(config, datasets), encoders))
    return encoders, datasets


def check_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every check of the plan stage, on a filled config (:func:`fmaudit.config.fill_config`); returns the
    (encoder, data-set) registries as the config sees them (its own registries added, ``encoder_revisions``
    applied). The workflow (``rules/common.smk``) and ``fmaudit check-config`` both call this."""
    encoders = add_hub_encoders(config, load_encoder_registries(config["encoder_registry"], config["encoder_entries"]))
    datasets = load_dataset_registries(config["dataset_registry"], config["dataset_entries"])
    for ds in config["datasets"]:
        if ds not in datasets:
            raise unknown_name_error("dataset", ds, list(datasets), "config 'datasets'")
    check_preparers(config, datasets)
    for ds, domains in check_own_data(config, datasets).items():
        # a task over one's own data without `domains:` transfers between the domains its sheet names
        datasets[ds] = {**datasets[ds], "domains": datasets[ds].get("domains") or domains}
    imports = feature_imports(config, datasets)
    encoders.update(precomputed_encoders(imports, encoders))
    check_names(config, encoders, datasets)
    encoders = apply_encoder_revisions(config, encoders)
    check_encoder_weights(config)
    check_grid(config, datasets)
    check_slide_sheets(config, datasets)
    check_feature_imports(config, datasets, encoders, imports)
    check_encoders_before_embedding(config, encoders)
    for path in config.get("claims") or []:  # a bad claims file stops the run now, not at the report
        load_claims(path)
    return encoders, datasets


# ---------------------------------------------------------------------------------------------- data stage


@dataclass(frozen=True)
class ClassReference:
    """Class names that a config key gives for a task (``key`` as the error names it)."""

    key: str
    task: str
    names: tuple[str, ...]


def class_references(config: Mapping[str, Any]) -> list[ClassReference]:
    """Every class name the config mentions for a tile-level task, with the key that mentions it: the classes held
    out by ``ood.near.<task>`` and ``ood.artefact.<task>``, the classes ``ood.coarsening.without`` removes from
    each coarsening task, the classes of every ``prior_shift.priors.<prior>``, and each task's
    ``allow_missing_classes``. Studies' own sections are prefixed with their key (``studies.<s>.ood.near...``)."""
    refs: list[ClassReference] = []
    for where, _, ood in parts_with(config, "ood"):
        for tier in ("near", "artefact"):
            for task, names in (ood.get(tier) or {}).items():
                refs.append(ClassReference(f"{where}.{tier}.{task}", task, tuple(str(n) for n in names or [])))
        coarsening = ood.get("coarsening") or {}
        for task in coarsening.get("tasks") or []:
            refs.append(ClassReference(f"{where}.coarsening.without", task,
                                       tuple(str(n) for n in coarsening.get("without") or [])))
    for where, _, prior_shift in parts_with(config, "prior_shift"):
        for prior, shares in prior_shift["priors"].items():
            refs.append(ClassReference(f"{where}.priors.{prior}", prior_shift["task"], tuple(str(n) for n in shares)))
    for prefix, part in study_parts(config):
        for task, spec in (part.get("tasks") or {}).items():
            if spec.get("allow_missing_classes"):
                refs.append(ClassReference(f"{prefix}tasks.{task}.allow_missing_classes", task,
                                           tuple(str(n) for n in spec["allow_missing_classes"])))
    # in a fixed order, whatever order the YAML lists them in: the validate rule's params are compared by their
    # printed form, and a config written back with sorted keys must not rerun the checks
    return sorted((ClassReference(r.key, r.task, tuple(sorted(r.names))) for r in refs if r.names),
                  key=lambda r: (r.key, r.task))


@dataclass(frozen=True)
class DataChecks:
    """What :func:`check_data` checks: ``manifests`` (data set -> manifest file), ``tasks`` (task -> its spec as
    :func:`fmaudit.grid.resolved_tile_tasks` gives it), the config's ``class_references``, and ``files`` (data set
    -> manifest file of every data set whose files an embedding job will read) with the image sample fully
    decoded (``decode_sample`` files per data set, drawn with ``decode_seed``)."""

    manifests: Mapping[str, str]
    tasks: Mapping[str, Mapping[str, Any]]
    class_references: Sequence[ClassReference] = field(default_factory=tuple)
    files: Mapping[str, str] = field(default_factory=dict)
    decode_sample: int = 64
    decode_seed: int = 0

    def as_params(self) -> dict[str, Any]:
        """Plain data, for a Snakemake rule's params (compared by their printed form); :meth:`from_params`
        reads it back."""
        return {"manifests": dict(sorted(self.manifests.items())),
                "tasks": {t: copy.deepcopy(dict(s)) for t, s in sorted(self.tasks.items())},
                "class_references": [[r.key, r.task, list(r.names)] for r in self.class_references],
                "files": dict(sorted(self.files.items())), "decode_sample": int(self.decode_sample),
                "decode_seed": int(self.decode_seed)}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "DataChecks":
        return cls(manifests=dict(params["manifests"]), tasks=dict(params["tasks"]),
                   class_references=tuple(ClassReference(k, t, tuple(n)) for k, t, n in params["class_references"]),
                   files=dict(params.get("files") or {}), decode_sample=int(params.get("decode_sample", 64)),
                   decode_seed=int(params.get("decode_seed", 0)))

    @property
    def inputs(self) -> list[str]:
        """Every manifest the checks read (the ``validate`` rule's inputs)."""
        return list(dict.fromkeys([*self.manifests.values(), *self.files.values()]))

    def restricted_to(self, tasks: Sequence[str]) -> "DataChecks":
        """The checks of ``tasks`` only (``fmaudit check-config`` on the tasks whose manifests are prepared)."""
        keep = {t: self.tasks[t] for t in tasks}
        datasets = {ds for spec in keep.values() for ds in spec["datasets"]}
        return DataChecks({ds: p for ds, p in self.manifests.items() if ds in datasets}, keep,
                          tuple(r for r in self.class_references if r.task in keep),
                          {ds: p for ds, p in self.files.items() if ds in datasets}, self.decode_sample,
                          self.decode_seed)


def data_checks(config: Mapping[str, Any], dataset_registry: Mapping[str, Any]) -> DataChecks:
    """The data stage's checks of a filled config: its tile-level tasks, the manifests the workflow prepares for
    them (:func:`fmaudit.config.manifest_file`), the class names it mentions and the files of every data set it
    embeds (features computed elsewhere have none)."""
    tasks = resolved_tile_tasks(config, dataset_registry)
    manifests = {ds: manifest_file(config, ds) for spec in tasks.values() for ds in spec["datasets"]}
    refs = [r for r in class_references(config) if r.task in tasks]
    pre = config["preflight"]
    embedded = dict.fromkeys(ds for _, ds in embed_pairs(config)) if pre["read_files"] else {}
    files = {ds: manifest_file(config, ds) for ds in embedded if dataset_registry[ds]["kind"] != "features"}
    return DataChecks(manifests, tasks, tuple(refs), files, int(pre["decode_sample"]), int(pre["seed"]))


def check_files(report: SplitValidationReport, frames: Mapping[str, pd.DataFrame], files: Mapping[str, str],
                decode_sample: int, decode_seed: int) -> None:
    """Add the file checks of every data set's manifest to ``report`` (:mod:`fmaudit.datasets.files`): every image
    header, a full decode of a seeded sample, every slide opened; rows ``image_headers``, ``image_decode`` and
    ``slides``, each problem naming the file and the item (and the sheet line of a user's sheet)."""
    for ds, path in files.items():
        frame = frames.get(ds)
        if frame is None:
            continue
        scope = f"manifest {path} (dataset {ds!r})"
        images = frame[frame["x"].isna()] if "x" in frame.columns else frame
        if len(images):
            problems, detail = check_image_headers(images)
            report.add("", "image_headers", scope, problems, detail)
            if not problems and decode_sample > 0:
                problems, detail = check_image_decode(images, decode_sample, decode_seed)
                report.add("", "image_decode", scope, problems, detail)
        if "x" in frame.columns and frame["x"].notna().any():
            problems, detail = check_slides(frame)
            report.add("", "slides", scope, problems, detail)


def check_test_groups(report: SplitValidationReport, tasks: Mapping[str, Mapping[str, Any]],
                      frames: Mapping[str, pd.DataFrame]) -> None:
    """A ``test_groups`` row per task and domain: a warning where the domain's labelled test split holds fewer
    than :data:`MIN_TEST_GROUPS` groups (intervals over so few clusters are wide and unstable), saying that
    there is no interval at all below 2 (the report then gives none and says why)."""
    for task, spec in tasks.items():
        present = [ds for ds in spec["datasets"] if ds in frames]
        if len(present) < len(spec["datasets"]):
            continue
        split_col = SPLIT_COLUMNS.get(spec.get("split", "manifest"), "split")
        parts = [frames[ds] for ds in present if split_col in frames[ds].columns]
        if not parts:
            continue
        rows = pd.concat([p[["label", "group", "domain", split_col]] for p in parts], ignore_index=True)
        rows = rows[rows["label"].notna() & (rows[split_col] == "test")]
        unit = "+".join(sorted({str(u) for ds in present for u in frames[ds].get("group_unit", pd.Series(["group"]))
                                .dropna().unique()})) or "group"
        domains = spec.get("domains") or sorted(rows["domain"].astype(str).unique())
        pooled = list(domains) == ["all"]
        for domain in domains:
            test = rows if pooled else rows[rows["domain"] == domain]
            n = int(test["group"].nunique())
            scope = f"test split of domain {domain!r}"
            if n == 0:
                continue  # the split checks name a domain without test items
            if n < 2:
                warning = (f"{n} test {unit}: no interval (a cluster bootstrap needs at least 2 {unit}s); the report "
                           f"gives this domain's metrics without an interval and says why")
            elif n < MIN_TEST_GROUPS:
                warning = (f"{n} test {unit}s: intervals over fewer than {MIN_TEST_GROUPS} {unit}s are wide and their "
                           "own width is uncertain; more test groups, or fewer splits (fractions), help")
            else:
                report.add(task, "test_groups", scope, [], f"{n} test {unit}s")
                continue
            report.add(task, "test_groups", scope, [], "", warnings=[warning])


def check_class_references(report: SplitValidationReport, refs: Sequence[ClassReference],
                           tasks: Mapping[str, Mapping[str, Any]], frames: Mapping[str, pd.DataFrame],
                           files: Mapping[str, str]) -> None:
    """Add a ``class_names`` row to ``report`` for each reference: an error naming the key, the unknown names and
    the task's classes (with a close spelling where there is one) when a name is not a class of the task's
    manifests."""
    for ref in refs:
        spec = tasks.get(ref.task)
        if spec is None:
            continue  # not a tile task of this config (the grid check names unknown tasks)
        present = [ds for ds in spec["datasets"] if ds in frames]
        if len(present) < len(spec["datasets"]):
            continue  # a missing manifest is reported by the split checks
        classes = sorted({str(n) for ds in present for n in frames[ds]["label_name"].dropna().unique()})
        unknown = [n for n in ref.names if n not in classes]
        where = ", ".join(files.get(ds, ds) for ds in present)
        problems = [f"{unknown_name_error('class', name, classes)} (classes of task {ref.task!r} in {where})"
                    for name in unknown]
        report.add(ref.task, "class_names", f"config '{ref.key}'", problems,
                   f"{len(ref.names)} class name(s) of task {ref.task!r}: {', '.join(ref.names)}")


def check_data(checks: DataChecks, frames: Mapping[str, pd.DataFrame] | None = None) -> SplitValidationReport:
    """Every check of the data stage on prepared manifests (see the module doc): returns the report of every
    check, or raises :class:`~fmaudit.split_checks.SplitValidationError` listing every problem of every check.
    ``frames`` gives manifests already in memory (``fmaudit check-config`` prepares a user's own data sets
    there); the others are read from their files."""
    given = dict(frames or {})
    paths = {**checks.files, **checks.manifests}
    frames = {ds: given[ds] if ds in given else read_table(path) for ds, path in paths.items()}
    task_frames = {ds: frames[ds] for ds in checks.manifests}
    try:
        report = validate_task_splits(task_frames, checks.tasks, files=dict(checks.manifests))
    except SplitValidationError as e:
        report = e.report
    check_class_references(report, checks.class_references, checks.tasks, task_frames, checks.manifests)
    check_files(report, frames, checks.files, checks.decode_sample, checks.decode_seed)
    check_test_groups(report, checks.tasks, task_frames)
    if not report.ok:
        problems = report.problems
        raise SplitValidationError(f"{len(problems)} problem(s) found before the first embedding:\n"
                                   + "\n".join(f"  - {p}" for p in problems), report)
    return report
