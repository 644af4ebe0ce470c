"""The prior-shift, variants and exposure sections: every declared output, the exposure column beside every
table that ranks encoders, and a note where the config planned nothing."""

import pandas as pd

from analyses.test_prior_shift_summary import BOOT, RULES, shard_rows
from fmaudit.report import write_report
from fmaudit.report.exposure import exposure_labels, with_exposure

AUDIT = pd.DataFrame({"encoder": ["e1", "e1", "e2", "e3"], "dataset": ["d1", "d2", "d1", "d1"],
                      "exposure": ["yes", "no", "unknown", "no"], "evidence": ["x", "y", "z", "w"]})


def test_exposure_labels_and_column():
    labels = exposure_labels(AUDIT)
    assert labels == {"e1": "yes: d1; no: d2", "e2": "unknown: d1", "e3": "no: d1"}
    table = pd.DataFrame({"task": ["t", "t"], "encoder": ["e2", "e9"], "macro_f1": [0.5, 0.6]})
    out = with_exposure(table, AUDIT)
    assert list(out.columns) == ["task", "encoder", "exposure", "macro_f1"]
    assert out["exposure"].tolist() == ["unknown: d1", "not audited"]
    assert with_exposure(table, None) is table and "exposure" not in table


def test_sections_write_their_tables_with_exposure_and_notes(tmp_path):
    from fmaudit.analyses.prior_shift_summary import summarize_prior_shift

    summary = summarize_prior_shift(shard_rows(), None, None, BOOT, {"t": RULES})
    summary["exposure"] = AUDIT
    write_report(tmp_path, {"probe": None, "embeddings": None, "prior_shift": summary, "exposure": AUDIT})
    tables = tmp_path / "tables"
    cells = pd.read_csv(tables / "prior_shift_negative_cells.csv")
    assert cells["exposure"].notna().all() and set(cells["exposure"]) == {"yes: d1; no: d2", "unknown: d1", "no: d1"}
    assert pd.read_csv(tables / "transfer_reference.csv")["note"].iloc[0] == "no transfer rows"
    assert pd.read_csv(tables / "encoder_variants.csv")["note"].iloc[0].startswith("no encoder variant")
    assert len(pd.read_csv(tables / "exposure_audit.csv")) == 4
    index = (tmp_path / "index.md").read_text()
    cbr = summary["prior_shift_summary"].set_index("method").loc["cbr"]
    assert f"{cbr['mean']:.3f} [{cbr['ci_lo']:.3f}, {cbr['ci_hi']:.3f}]" in index  # the mean gain with its interval
    assert "unit: encoder > seed > draw" in index and "B=80" in index
    assert "(2/2)" in index  # both targets gain under a prior
    assert (tmp_path / "figures" / "prior_shift_gains.png").stat().st_size > 1000


def test_a_config_without_prior_shift_gets_notes(tmp_path):
    write_report(tmp_path, {"probe": None, "embeddings": None})
    note = pd.read_csv(tmp_path / "tables" / "prior_shift_summary.csv")["note"].iloc[0]
    assert note.startswith("no prior-shift runs were planned")
    assert "Class-prior shift" not in (tmp_path / "index.md").read_text()


def test_assumed_priors_are_labelled_as_assumed_in_every_table_and_the_text(tmp_path):
    """The hematology paper names its priors but gives no shares: a prior listed in prior_shift.assumed_priors
    is labelled "assumed" in every table with a prior column and "(shares assumed)" where the report shows it."""
    from fmaudit.analyses.prior_shift_summary import summarize_prior_shift

    rows = shard_rows()
    prior = sorted(rows["prior"].astype(str).unique())[-1]
    summary = summarize_prior_shift(rows, None, None, BOOT, {"t": RULES}, {"t": [prior]})
    write_report(tmp_path, {"probe": None, "embeddings": None, "prior_shift": summary})
    gains = pd.read_csv(tmp_path / "tables" / "prior_shift_gains.csv")
    shares = gains.drop_duplicates("prior").set_index("prior")["prior_shares"].to_dict()
    assert shares[prior] == "assumed" and set(shares.values()) == {"assumed", "as configured"}
    for name in ("prior_shift_scenarios", "prior_shift_regret", "prior_shift_calibration", "prior_shift_recall"):
        assert "prior_shares" in pd.read_csv(tmp_path / "tables" / f"{name}.csv").columns, name
    index = (tmp_path / "index.md").read_text()
    assert f"{prior} (shares assumed)" in index and f"The shares of {prior} are assumptions" in index
