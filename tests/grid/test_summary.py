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
