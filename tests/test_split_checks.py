"""validate_task_splits: one negative test per check, all problems in one error, arrays as well as manifests."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest

from fmaudit.datasets.manifest import make_manifest
from fmaudit.io import FmauditInputError
from fmaudit.split_checks import CHECKS, SplitValidationError, validate_task_splits

CLASSES = ["tumour", "stroma", "immune"]


def manifest(dataset="ds", domains=("a", "b"), patients=4, per_class=2, tiles=False, root="/data"):
    """Group-disjoint manifest: per domain, patients 0-1 train, 2 val, 3.. test; every class everywhere."""
    rows = []
    for dom in domains:
        for p in range(patients):
            split = "train" if p < 2 else ("val" if p == 2 else "test")
            for c, name in enumerate(CLASSES):
                for i in range(per_class):
                    item = f"{dom}_p{p}_c{c}_{i}"
                    row = {"dataset": dataset, "item_id": item, "label": c, "label_name": name,
                           "group": f"{dom}-p{p}", "domain": dom, "split": split}
                    if tiles:
                        row.update(source=f"{root}/{dom}_p{p}.svs", x=1000 * c, y=224 * i, level=0, size=224)
                    else:
                        row["source"] = f"{root}/{dataset}/{item}.png"
                    rows.append(row)
    return make_manifest(rows)


def task(datasets=("ds",), domains=("a", "b"), **extra):
    return {"demo": {"datasets": list(datasets), "domains": list(domains), **extra}}


def problems_of(excinfo) -> str:
    return str(excinfo.value)


def test_a_clean_manifest_passes_and_reports_every_check():
    report = validate_task_splits({"ds": manifest(tiles=True)}, task(), files={"ds": "results/manifests/ds.parquet"})
    assert report.ok
    table = report.to_frame()
    assert set(CHECKS) - {"duplicate_files"} <= set(table["check"])  # duplicate_files too, at manifest level
    assert "duplicate_files" in set(table["check"])
    assert (table["status"] == "ok").all()
    # per source domain: the training split and what its probe is evaluated on
    evaluated = table[table["check"] == "evaluated_classes"]
    assert set(evaluated["scope"]) == {"source domain 'a'", "source domain 'b'"}
    assert evaluated["detail"].str.contains("2 target domain").all()


def test_missing_column_names_the_file():
    df = manifest().drop(columns=["group"])
    with pytest.raises(SplitValidationError,
                       match=r"manifest m\.parquet \(dataset 'ds'\): missing column\(s\) \['group'\]"):
        validate_task_splits({"ds": df}, task(), files={"ds": "m.parquet"})


def test_bad_split_value_and_unknown_dataset():
    df = manifest()
    df.loc[3, "split"] = "training"
    with pytest.raises(SplitValidationError) as e:
        validate_task_splits({"ds": df}, {"t": {"datasets": ["ds", "other"]}})
    text = problems_of(e)
    assert "split value(s) ['training']" in text
    assert "no manifest given for data set 'other'" in text


def test_duplicate_item_ids():
    df = manifest()
    df.loc[5, "item_id"] = df.loc[4, "item_id"]
    with pytest.raises(SplitValidationError, match=r"1 item id\(s\) occur more than once: 'a_p0_c2_0'"):
        validate_task_splits({"ds": df}, task())


def test_one_image_file_under_two_ids():
    df = manifest()
    df.loc[7, "source"] = df.loc[6, "source"]
    with pytest.raises(SplitValidationError) as e:
        validate_task_splits({"ds": df}, task())
    assert "1 file(s) under more than one item id" in problems_of(e)
    assert f"{df.loc[6, 'source']} -> ['{df.loc[6, 'item_id']}', '{df.loc[7, 'item_id']}']" in problems_of(e)


def test_one_slide_tile_under_two_ids_but_other_tiles_of_the_slide_are_fine():
    df = manifest(tiles=True)
    assert validate_task_splits({"ds": df}, task()).ok  # many tiles share a slide path
    df.loc[1, ["x", "y"]] = df.loc[0, ["x", "y"]].to_numpy()
    with pytest.raises(SplitValidationError, match=r"1 slide tile\(s\) \(source x y level size\) under more than one"):
        validate_task_splits({"ds": df}, task())


def test_one_file_in_two_data_sets_of_a_task():
    one = manifest("one", root="/data")
    two = manifest("two", root="/data")
    two["source"] = one["source"].to_numpy()  # the same absolute paths under another data set
    with pytest.raises(SplitValidationError) as e:
        validate_task_splits({"one": one, "two": two}, task(("one", "two")))
    assert "under more than one item id" in problems_of(e)
    assert "'one:a_p0_c0_0', 'two:a_p0_c0_0'" in problems_of(e)


def test_group_on_two_splits_names_group_splits_domain_and_file():
    df = manifest()
    df.loc[(df["group"] == "b-p3") & (df["label"] == 0), "split"] = "train"
    with pytest.raises(SplitValidationError) as e:
        validate_task_splits({"ds": df}, task(), files={"ds": "results/manifests/ds.parquet"})
    text = problems_of(e)
    assert "task 'demo', manifest results/manifests/ds.parquet (dataset 'ds')" in text
    assert "1 group(s) of domain 'b' are on more than one split (leakage)" in text
    assert "'b-p3' on test (4 items) and train (2 items)" in text


def test_group_overlap_can_be_allowed_explicitly(caplog):
    df = manifest()
    df.loc[(df["group"] == "a-p0") & (df["label"] == 2), "split"] = "test"
    with caplog.at_level(logging.WARNING, logger="fmaudit.split_checks"):
        report = validate_task_splits({"ds": df}, task(), allow_group_overlap=True)
    allowed = report.to_frame().query("status == 'allowed'")
    assert list(allowed["check"]) == ["group_disjoint"]
    assert "'a-p0' on test (2 items) and train (4 items)" in allowed["detail"].iloc[0]
    assert "allowed by allow_group_overlap" in caplog.text


def test_same_group_name_in_two_domains_is_not_leakage_but_is_when_pooled():
    df = manifest()
    df.loc[df["domain"] == "b", "group"] = df.loc[df["domain"] == "b", "group"].str.replace("b-", "a-")
    assert validate_task_splits({"ds": df}, task()).ok  # per-domain groups: 'a-p0' of b is another patient
    df.loc[(df["domain"] == "b") & (df["group"] == "a-p0"), "split"] = "test"
    with pytest.raises(SplitValidationError, match="group\\(s\\) of the pooled domains are on more than one split"):
        validate_task_splits({"ds": df}, task(domains=["all"]))


def test_leaky_groups_match_a_plain_set_reimplementation():
    rng = np.random.default_rng(3)
    n = 2000
    df = make_manifest({
        "dataset": "ds", "item_id": [f"i{i}" for i in range(n)], "source": [f"/d/{i}.png" for i in range(n)],
        "label": rng.integers(0, 3, n), "group": [f"g{g}" for g in rng.integers(0, 400, n)],
        "domain": "a", "split": rng.choice(["train", "val", "test"], n, p=[0.9, 0.05, 0.05]),
    })
    expected = {g for g, s in df.groupby("group")["split"] if len(set(s)) > 1}
    with pytest.raises(SplitValidationError) as e:
        validate_task_splits({"ds": df}, task(domains=["a"]), max_examples=10_000)
    assert f"{len(expected)} group(s) of domain 'a'" in problems_of(e)
    named = {g for g in expected if f"'{g}' on " in problems_of(e)}
    assert named == expected


def test_label_gap_and_inconsistent_names():
    df = manifest()
    df.loc[df["label"] == 1, "label"] = 3  # labels 0, 2, 3: label 1 has no items
    df.loc[0, "label_name"] = "tumor"  # label 0 named twice
    df.loc[df["label"] == 2, "label_name"] = "stroma"  # 'stroma' is now labels 2 and 3
    with pytest.raises(SplitValidationError) as e:
        validate_task_splits({"ds": df}, task())
    text = problems_of(e)
    assert "label(s) [1] have no items although labels go up to 3" in text
    assert "label 0 has several names: ['tumor', 'tumour']" in text
    assert "class name 'stroma' has several labels: [2, 3]" in text


def test_non_integer_labels():
    frame = {"item_id": ["a", "b", "c", "d"], "label": [0.0, 1.5, 1.0, 0.0], "group": ["1", "2", "3", "4"],
             "domain": "all", "split": ["train", "train", "test", "test"]}
    with pytest.raises(SplitValidationError, match=r"labels must be integers 0..K-1; found '1.5'"):
        validate_task_splits({"arrays": frame})


def test_single_class_training_split_and_missing_training_split():
    df = manifest()
    df = df[~((df["domain"] == "a") & (df["split"] == "train") & (df["label"] > 0))]
    df = df[~((df["domain"] == "b") & (df["split"] == "train"))]
    with pytest.raises(SplitValidationError) as e:
        validate_task_splits({"ds": df}, task())
    text = problems_of(e)
    assert "the train split of domain 'a' holds a single class ('tumour'); a probe needs at least two" in text
    assert "no labelled items on the train split of domain 'b'" in text


def test_class_evaluated_but_absent_from_training():
    df = manifest()
    df = df[~((df["domain"] == "a") & (df["split"] == "train") & (df["label"] == 2))]
    with pytest.raises(SplitValidationError) as e:
        validate_task_splits({"ds": df}, task())
    text = problems_of(e)
    # in-domain and on the transfer target, both for the probe of source domain a
    assert ("class 'immune' (label 2) is evaluated on the test split of domain 'a' but absent from the train split "
            "of domain 'a' (label 2 is outside the training labels 0..1)") in text
    assert "is evaluated on the test split of domain 'b' but absent from the train split of domain 'a'" in text
    assert "allow_missing_classes" in text
    assert "source domain 'b'" not in text


def test_missing_class_without_transfer_checks_only_in_domain():
    df = manifest()
    df = df[~((df["domain"] == "a") & (df["label"] == 1))]  # class 1 absent from a entirely: fine in-domain
    assert validate_task_splits({"ds": df}, task(transfer=False)).ok
    with pytest.raises(SplitValidationError, match="class 'stroma' \\(label 1\\) is evaluated on the test split of "
                                                   "domain 'b' but absent from the train split of domain 'a'"):
        validate_task_splits({"ds": df}, task())


def test_target_domain_without_test_split_is_evaluated_on_all_its_items():
    df = manifest()
    df.loc[(df["domain"] == "b") & (df["split"] != "train"), "split"] = "unassigned"
    df = df[~((df["domain"] == "a") & (df["split"] == "train") & (df["label"] == 2))]
    with pytest.raises(SplitValidationError) as e:
        validate_task_splits({"ds": df}, task())
    text = problems_of(e)
    assert ("class 'immune' (label 2) is evaluated on domain 'b' (no test split: all its items) but absent from "
            "the train split of domain 'a'") in text
    assert "domain 'b' has no test items to evaluate its probe on" in text  # b as a source needs a test split


def test_missing_classes_can_be_allowed_per_task_by_name():
    df = manifest()
    df = df[~((df["domain"] == "a") & (df["split"] == "train") & (df["label"] == 2))]
    report = validate_task_splits({"ds": df}, task(allow_missing_classes=["immune"]))
    allowed = report.to_frame().query("status == 'allowed'")
    assert set(allowed["check"]) == {"evaluated_classes"}
    assert len(allowed) == 2  # in-domain and on domain b
    with pytest.raises(SplitValidationError, match=r"names class\(es\) \['immnue'\] that the task does not have"):
        validate_task_splits({"ds": df}, task(allow_missing_classes=["immune", "immnue"]))


def test_source_domain_without_test_items():
    df = manifest()
    df = df[~((df["domain"] == "a") & (df["split"] == "test"))]
    with pytest.raises(SplitValidationError, match="domain 'a' has no test items to evaluate its probe on"):
        validate_task_splits({"ds": df}, task())


def test_task_domain_without_items():
    with pytest.raises(SplitValidationError, match=r"domain\(s\) \['c'\] of the task have no labelled items"):
        validate_task_splits({"ds": manifest()}, task(domains=["a", "b", "c"]))


def test_every_problem_is_listed_not_only_the_first():
    df = manifest()
    df.loc[(df["group"] == "b-p3") & (df["label"] == 0), "split"] = "train"
    df = df[~((df["domain"] == "a") & (df["split"] == "train") & (df["label"] == 2))].reset_index(drop=True)
    df.loc[len(df) - 1, "item_id"] = df.loc[len(df) - 2, "item_id"]
    with pytest.raises(SplitValidationError) as e:
        validate_task_splits({"ds": df}, task())
    assert isinstance(e.value, FmauditInputError)
    errors = e.value.report.to_frame().query("status == 'error'")
    assert {"duplicate_item_ids", "group_disjoint", "evaluated_classes"} <= set(errors["check"])
    assert str(e.value).startswith(f"{len(errors)} problem(s) in the task splits")


def test_unlabelled_items_take_no_part_in_task_checks():
    df = manifest()
    extra = df.iloc[:3].copy()
    extra["item_id"] = ["u1", "u2", "u3"]
    extra["source"] = ["/u/1.png", "/u/2.png", "/u/3.png"]
    extra["label"] = pd.NA
    extra["split"] = "test"  # same group as train items, but unlabelled: not evaluated
    assert validate_task_splits({"ds": pd.concat([df, extra], ignore_index=True)}, task()).ok


def test_arrays_of_the_command_line():
    frame = {"item_id": [f"i{i}" for i in range(8)], "label": [0, 1, 0, 1, 0, 1, 0, 2],
             "group": ["p1", "p1", "p2", "p2", "p3", "p3", "p1", "p4"], "domain": "all",
             "split": ["train"] * 4 + ["test"] * 4}
    with pytest.raises(SplitValidationError) as e:
        validate_task_splits({"arrays": frame})
    text = problems_of(e)
    assert "'p1' on test (1 items) and train (2 items)" in text
    assert "class 'class_2' (label 2) is evaluated on the test split" in text
    frame["label"][-1] = 1
    report = validate_task_splits({"arrays": frame}, allow_group_overlap=True)
    assert report.ok


def test_columns_of_different_lengths_are_a_clear_error():
    with pytest.raises(FmauditInputError, match="arrays: the columns given do not have one value per item"):
        validate_task_splits({"arrays": {"item_id": ["a", "b"], "label": [0]}})


def test_config_schema_takes_allow_missing_classes_per_task():
    import jsonschema
    import yaml

    from fmaudit.registry import RESOURCES

    schema = yaml.safe_load((RESOURCES / "schemas" / "config.schema.yaml").read_text())
    config = {"data_root": "d", "encoders": ["e"], "datasets": ["ds"],
              "tasks": {"t": {"datasets": ["ds"], "allow_missing_classes": ["immune"]}}}
    jsonschema.validate(config, schema)
    config["tasks"]["t"]["allow_missing_classes"] = "immune"
    with pytest.raises(jsonschema.ValidationError, match="is not of type 'array'"):
        jsonschema.validate(config, schema)


def test_a_task_on_prisms_leaky_patch_split_checks_that_column_and_allows_its_declared_leak():
    df = manifest()
    df["split_patch"] = df["split"]
    df.loc[(df["group"] == "a-p0") & (df["label"] == 2), "split_patch"] = "test"  # PRISM's patch split leaks
    leaky = task(split="patch (leaky, as published)")
    report = validate_task_splits({"ds": df}, leaky)
    assert list(report.to_frame().query("status == 'allowed'")["check"]) == ["group_disjoint"]
    validate_task_splits({"ds": df}, task())  # the manifest's own split stays clean
    df.loc[df["label"] == 1, "split_patch"] = "test"  # a class absent from the patch split's training
    with pytest.raises(SplitValidationError, match="stroma"):
        validate_task_splits({"ds": df}, leaky)
    with pytest.raises(SplitValidationError, match="split_patch"):
        validate_task_splits({"ds": df.drop(columns="split_patch")}, leaky)
