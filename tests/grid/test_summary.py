"""What `fmaudit grid` prints: jobs counted once, runs per kind of unit, planned or declared."""


from fmaudit import grid
from fmaudit.config import fill_config


def _config(**probe):
    return fill_config({
        "data_root": "data",
        "encoders": ["a", "b"],
        "datasets": ["d1"],
        "tasks": {"t": {"datasets": ["d1"], "domains": ["x", "y", "z"]}, "u": {"datasets": ["d1"], "transfer": False}},
        "probe": {"fractions": [0.1, 1.0], "seeds": [0, 1, 2], "heads": ["logistic", "1nn"], **probe},
    })


def test_summary_counts_jobs_not_runs():
    s = grid.summarize(_config())
    fits = s[(s["analysis"] == "probe") & (s["protocol"] == "fits (in-domain)")].iloc[0]
    assert fits["runs"] == len(grid.probe_runs(_config()))
    assert fits["jobs"] == 4


def test_every_analysis_ends_with_a_total_and_the_config_with_a_grand_total():
    s = grid.summarize(_config(), totals=True)
    probe_total = s[(s["analysis"] == "probe") & (s["protocol"] == "total")].iloc[0]
    assert probe_total["runs"] == len(grid.probe_runs(_config()))  # fits, not their evaluations
    assert probe_total["jobs"] == 4
    grand = s.iloc[-1]
    assert (grand["analysis"], grand["protocol"]) == ("all", "total (config)")
    totals = s[s["protocol"] == "total"]
    assert grand["runs"] == totals["runs"].sum() and grand["jobs"] == totals["jobs"].sum()


def test_the_cellpath_preset_totals_304920_runs():
    from fmaudit.config import load_config
    from fmaudit.schema import REPO_ROOT

    s = grid.summarize(load_config(REPO_ROOT / "resources" / "presets" / "cellpath.yaml"), totals=True)
    cells = s[(s["analysis"] == "cells") & (s["protocol"] == "total")].iloc[0]
    assert cells["runs"] == 304_920 and cells["jobs"] == 750 + 360 and bool(cells["planned"])
    assert s.iloc[-1]["runs"] == 304_920


def test_without_totals_every_job_is_on_one_row():
    s = grid.summarize(_config())
    assert "total" not in set(s["protocol"]) and s["jobs"].sum() == 2 + 4  # embed pairs + probe shards


def _configs():
    from fmaudit.config import load_config
    from fmaudit.schema import REPO_ROOT

    presets = sorted((REPO_ROOT / "resources" / "presets").glob("*.yaml"))
    return [("demo", load_config(REPO_ROOT / "config.yaml"))] + [(p.stem, load_config(p)) for p in presets]


def test_counted_runs_and_jobs_are_the_enumerated_ones_on_the_demo_and_every_preset():
    from fmaudit.registry import load_dataset_registry

    for name, config in _configs():
        registry = load_dataset_registry(config["dataset_registry"])
        for analysis in grid.ANALYSES:
            counted = grid.count_runs(config, registry, analysis)
            table = grid.enumerate_runs(config, registry, analysis)
            assert counted["runs"].sum() == len(table), (name, analysis)
            expected = grid.jobs(table, analysis)
            keys = list(grid.JOB_KEYS[analysis])
            assert (counted[keys].astype(str).values.tolist()
                    == expected[keys].astype(str).values.tolist()), (name, analysis)
            if len(table):
                per_job = table.groupby(keys, sort=False, observed=True).size().to_numpy()
                assert counted["runs"].tolist() == per_job.tolist(), (name, analysis)


def test_the_printed_table_says_why_its_jobs_are_fewer_than_snakemakes(capsys):
    from fmaudit import cli
    from fmaudit.schema import REPO_ROOT

    assert cli.main(["grid", "--configfile", str(REPO_ROOT / "resources" / "presets" / "cellpath.yaml")]) == 0
    out = capsys.readouterr().out
    # 750 feature jobs (encoder x section) + 360 shards
    assert "304920" in out and "1110" in out and grid.JOBS_NOTE in out
