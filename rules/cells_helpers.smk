# Helpers of rules/cells.smk: the cell branch as the config plans it (CELL_PLAN), its paths, each job's inputs and
# settings, and what the cell chapter of the report reads and states. With no `cells` block in the config,
# CELL_PLAN is None and the branch plans nothing (its rules are still defined; their helpers are never called).

from fmaudit.cells.table import section_lists
from fmaudit.config import dataset_params
from fmaudit.grid import cell_plan, protocol_sections
from fmaudit.io import FmauditInputError
from fmaudit.registry import embedding_spec

try:
    # The cell branch as the workflow plans it (fmaudit.grid.cell_plan): sections with their organ and data
    # set, one feature job per (encoder, section, magnification), one shard per (encoder, magnification,
    # protocol). Built from the config's factors, never from the run table, so a 300,000-run grid plans fast.
    # each cell-level data set's sections: a xenium_cells set's `sections`, a cell_table's slides
    CELL_PLAN = cell_plan(config, section_lists(config, DATASETS))
except FmauditInputError as err:
    raise WorkflowError(str(err))
CELLS = f"{RESULTS}/cells"
# The cell branch's split checks (fmaudit.split_checks.validate_cell_panel), once every section is prepared;
# every feature and shard job depends on it (as ancient(), like validated_splits()).
CELL_VALIDATION = f"{RESULTS}/validation/cells.tsv"
CELL_RUNS = f"{RESULTS}/aggregate/cell_runs.parquet"


def mag(m):
    """A magnification as it appears in paths and wildcards: 20, 10, 40 (12.5 stays 12.5)."""
    return f"{float(m):g}"


# The magnifications of every feature job, in the order of its outputs: a job embeds its section at all of them.
CELL_MAGNIFICATIONS = [mag(m) for m in CELL_PLAN.cells["magnifications"]] if CELL_PLAN is not None else []
# the one magnification of the rule's outputs when the config has no cell branch (the rule is then never planned;
# its outputs, logs and benchmark must still share their wildcards)
UNPLANNED_MAGNIFICATIONS = ["0"]


def cell_feature_folders():
    """The outputs of one (encoder, section) feature job: a folder per magnification."""
    return [
        directory(f"{CELLS}/features/{{encoder}}/{{key}}/{m}x/{{section}}")
        for m in CELL_MAGNIFICATIONS or UNPLANNED_MAGNIFICATIONS
    ]


def cell_feature_logs():
    """A log per magnification of a feature job, where the per-magnification jobs wrote theirs."""
    return [
        f"{RESULTS}/logs/cell_features/{{encoder}}/{{key}}/{m}x/{{section}}.log"
        for m in CELL_MAGNIFICATIONS or UNPLANNED_MAGNIFICATIONS
    ]


def cell_magnifications(wildcards):
    """The magnifications a feature job embeds, in the order of its outputs."""
    return [float(m) for m in CELL_MAGNIFICATIONS]


def cell_features_request(wildcards, input, threads):
    """What a feature job asks for at attempt 1 (fmaudit.cluster.RequestPlanner.cell_features): from the encoder
    and the section's patches at each magnification, or the earlier run's benchmark files of this encoder."""
    return PLANNER.cell_features(wildcards.encoder, input.manifest, cell_magnifications(wildcards), threads)


def cell_features_mem_mb(wildcards, input, threads, attempt):
    return cell_features_request(wildcards, input, threads).at(attempt)[0]


def cell_features_runtime(wildcards, input, threads, attempt):
    return cell_features_request(wildcards, input, threads).at(attempt)[1]


def cell_manifest_path(section):
    return f"{CELLS}/sections/{section}.parquet"


def cell_qc_path(section):
    return f"{CELLS}/qc/{section}.png"


def cell_features_path(encoder, section, magnification):
    """A feature folder, under the encoder's embedding key (a change of what decides the numbers writes beside
    the earlier features instead of over them)."""
    return f"{CELLS}/features/{encoder}/{EMBEDDING_KEY[encoder]}/{mag(magnification)}x/{section}"


def cell_shard_path(protocol, encoder, magnification):
    return f"{RESULTS}/shards/cells/{protocol}/{encoder}/{mag(magnification)}x.parquet"


def validated_cells():
    return ancient(CELL_VALIDATION)


def cell_section(wildcards):
    """What a section's preparation depends on: its id, organ, data set and the data set's parameters."""
    if CELL_PLAN is None or wildcards.section not in CELL_PLAN.organ_of:
        raise unknown_name_error(
            "section", wildcards.section, CELL_PLAN.sections if CELL_PLAN else [], "config 'cells.sections'"
        )
    dataset = CELL_PLAN.dataset_of[wildcards.section]
    entry = {
        "section": wildcards.section,
        "organ": CELL_PLAN.organ_of[wildcards.section],
        "dataset": dataset,
        "params": dataset_params(config, DATASETS, dataset),
    }
    if DATASETS[dataset]["kind"] != "xenium_cells":  # (Xenium sections' params stay as they were: no rerun)
        entry["kind"] = DATASETS[dataset]["kind"]
    return canonical(entry)


def cell_section_inputs(wildcards):
    """The sheets a cell_table section is read from (an edit prepares it again); a Xenium section has none here."""
    cell_section(wildcards)
    dataset = CELL_PLAN.dataset_of[wildcards.section]
    if DATASETS[dataset]["kind"] != "cell_table":
        return []
    params = dataset_params(config, DATASETS, dataset)
    return [params["slides"], params["cells"]]


def cell_sections(wildcards):
    """Every section of the panel, sorted (a reordered config reruns nothing)."""
    return sorted(CELL_PLAN.sections)


def cell_section_manifests(wildcards):
    """Every section's manifest (what the cell checks read)."""
    return [cell_manifest_path(s) for s in sorted(CELL_PLAN.sections)]


def cell_taxonomies(wildcards):
    """taxonomy name -> its task and the class names the task allows to be missing from training."""
    return canonical(
        {
            name: {
                "task": task,
                "allow_missing_classes": list(config["tasks"][task].get("allow_missing_classes") or []),
            }
            for name, task in CELL_PLAN.taxonomy_tasks.items()
        }
    )


# The keys of cells.probe the cell checks read: they draw each partition as the shards do (fmaudit.split_checks.
# validate_cell_panel), so a change of C, tol or max_iter reruns the shards but not the checks.
CELL_VALIDATION_PROBE_KEYS = ("val_fraction", "max_train_cells", "max_val_cells")


def cell_validation_settings(wildcards):
    """What the cell checks depend on: sections, protocols and the probe's draw sizes (no encoder)."""
    cells = CELL_PLAN.cells
    return canonical(
        {
            "sections": cells["sections"],
            "protocols": cells["protocols"],
            "probe": {k: cells["probe"][k] for k in CELL_VALIDATION_PROBE_KEYS},
        }
    )


def cell_encoder(wildcards):
    encoder = config_name("encoder", wildcards.encoder, "encoders")
    if wildcards.key != EMBEDDING_KEY[encoder]:
        raise FmauditInputError(
            f"cell features of {encoder!r} with key {wildcards.key} were asked for, but the config gives encoder "
            f"{encoder!r} the key {EMBEDDING_KEY[encoder]}"
        )
    return encoder


CELL_ENCODER_ENTRIES = {}


def cell_encoder_entry(wildcards):
    """What decides an encoder's cell features (as encoder_entry for embeddings); computed once per encoder:
    the CellPath preset asks 750 times."""
    encoder = cell_encoder(wildcards)
    if encoder not in CELL_ENCODER_ENTRIES:
        CELL_ENCODER_ENTRIES[encoder] = canonical(embedding_spec(ENCODERS[encoder]))
    return CELL_ENCODER_ENTRIES[encoder]


def cell_encoder_weights(wildcards):
    return weights_override(cell_encoder(wildcards))


def cell_feature_set_path(encoder, magnification):
    """The merge of one encoder's feature folders at one magnification (every section), which the shards read:
    one input per shard instead of two per section keeps the preset's dry run fast."""
    return f"{CELLS}/features/{encoder}/{EMBEDDING_KEY[encoder]}/{mag(magnification)}x.json"


def cell_feature_set_inputs(wildcards):
    """Every section's feature folder of this encoder and magnification, and the sections' manifests."""
    cell_encoder(wildcards)
    sections = sorted(CELL_PLAN.sections)  # the order of params.sections: a reordered config reruns nothing
    return {
        "manifests": [cell_manifest_path(s) for s in sections],
        "features": [cell_features_path(wildcards.encoder, s, wildcards.magnification) for s in sections],
    }


def cell_shard_inputs(wildcards):
    """This encoder's feature set at this magnification and the MOCV fold manifest: nothing of other encoders
    or magnifications."""
    config_name("encoder", wildcards.encoder, "encoders")
    spec = CELL_PLAN.cells["protocols"][wildcards.protocol]
    folds = [spec["fold_manifest"]] if wildcards.protocol == "MOCV" and spec.get("fold_manifest") else []
    return {"features": cell_feature_set_path(wildcards.encoder, wildcards.magnification), "folds": folds}


CELL_SHARD_SETTINGS = {}


def cell_shard_settings(wildcards):
    """The cells block as one protocol's shard reads it: its own protocol only, no encoder list and no
    magnification list, so adding an encoder, a magnification or another protocol's seed reruns no shard."""
    if wildcards.protocol not in CELL_SHARD_SETTINGS:
        cells = CELL_PLAN.cells
        out = {k: cells[k] for k in ("taxonomies", "sections", "readouts", "probe")}
        out["protocols"] = {wildcards.protocol: cells["protocols"][wildcards.protocol]}
        out["read_sections"] = protocol_sections(cells, wildcards.protocol)
        CELL_SHARD_SETTINGS[wildcards.protocol] = canonical(out)
    return CELL_SHARD_SETTINGS[wildcards.protocol]


def cell_taxonomy_tasks(wildcards):
    """The tasks the cell taxonomies label with, sorted."""
    return sorted(set(CELL_PLAN.taxonomy_tasks.values()))


def all_cell_shards(wildcards):
    """Every cell shard the config plans (none without a `cells` block)."""
    if CELL_PLAN is None:
        return []
    return [cell_shard_path(p, e, m) for e, m, p in CELL_PLAN.shard_jobs]


def cell_report_settings():
    """What the cell chapter of the report states: magnifications, protocols with their seeds, taxonomies, the
    pretraining scale of each encoder (the landscape's point size, from the registry), the panel's sections and
    the nested section subsets (cells.subsets: sizes and lists; a scores table is an input of the report)."""
    if CELL_PLAN is None:  # the captions still render (the chapter's outputs are notes then)
        return {
            "magnifications": [],
            "protocols": {},
            "taxonomies": {},
            "readouts": [],
            "pretraining_wsis": {},
            "sections": [],
            "subsets": {},
        }
    cells = CELL_PLAN.cells
    subsets = {k: v for k, v in (cells.get("subsets") or {}).items() if k != "scores"}  # the scores are an input
    return canonical(
        {
            "magnifications": [float(m) for m in cells["magnifications"]],
            "protocols": cells["protocols"],
            "taxonomies": dict(cells["taxonomies"]),
            "readouts": list(cells["readouts"]),
            "pretraining_wsis": {e: ENCODERS[e].get("pretraining_wsis") for e in CELL_PLAN.encoders},
            "sections": list(CELL_PLAN.sections),
            "subsets": subsets,
        }
    )


if CELL_PLAN is not None:
    REPORT_INPUTS.update(
        cell_runs=[CELL_RUNS],
        cell_qc=[cell_qc_path(s) for s in CELL_PLAN.sections],
        cell_manifests=[cell_manifest_path(s) for s in CELL_PLAN.sections],
    )
    scores = (CELL_PLAN.cells.get("subsets") or {}).get("scores")  # the table ranking sections for the subsets
    REPORT_INPUTS["cell_subset_scores"] = [scores] if scores else []
REPORT_SETTINGS["cells"] = cell_report_settings()


record_signatures(globals())
