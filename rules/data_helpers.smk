# Helpers of rules/data.smk: what a data set's preparation and download depend on, and what the validate job
# checks.

from fmaudit.config import dataset_params
from fmaudit.preflight import data_checks


def dataset_entry(wildcards):
    """What a data set's preparation depends on: its preparer, its group unit and the registry's parameters with
    the config's overrides (params of prepare_manifest). Its description, licence or citation are left out, so
    editing them rebuilds no manifest (and no embedding after it)."""
    dataset = config_name("dataset", wildcards.dataset, "datasets")
    entry = {"preparer": DATASETS[dataset]["preparer"], "params": dataset_params(config, DATASETS, dataset)}
    if "group_unit" in DATASETS[dataset]:  # what the group column is: the manifest records it for every interval
        entry["group_unit"] = DATASETS[dataset]["group_unit"]
    return canonical(entry)


def download_entry(wildcards):
    """What a data set's download depends on: its files (URLs, checksums) and how to get it otherwise."""
    dataset = config_name("dataset", wildcards.dataset, "datasets")
    return canonical({k: DATASETS[dataset][k] for k in ("files", "how_to_get") if k in DATASETS[dataset]})


def dataset_input_files(wildcards):
    """The sheets a preparation reads (slide sheets; the sheet of an own-data set: image_table, slide_table,
    features), so that editing one prepares the manifest again."""
    params = dataset_params(config, DATASETS, config_name("dataset", wildcards.dataset, "datasets"))
    return [params[key] for key in ("slides", "sheet") if isinstance(params.get(key), str)]


def downloadable_datasets(wildcards):
    """Download markers of the config's data sets whose registry entry lists files to fetch."""
    return [f"{RESULTS}/downloads/{ds}.done" for ds in config["datasets"] if DATASETS[ds].get("files")]


# What the validate job checks (fmaudit.preflight.data_checks): every tile-level task with its resolved domains,
# the manifests they read, the class names the config mentions and the files of every data set it embeds.
DATA_CHECKS = data_checks(config, DATASETS)


record_signatures(globals())
