"""The prior-shift shard: one (encoder, source, target) job of the grid, exactly the grid's runs."""

import numpy as np
import pandas as pd
import pytest

from fmaudit import grid, metrics
from fmaudit.adapt.priors import draw_seed, prior_vector, resample_target
from fmaudit.adapt.source_probe import SourceProbe
from fmaudit.analyses.prior_shift import run_prior_shift_shard
from fmaudit.io import FmauditInputError
from fmaudit.schema import REPO_ROOT, load_yaml

CLASSES = ["a", "b", "c"]
PRIORS = {"balanced": {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, "skewed": {"a": 0.1, "b": 0.2, "c": 0.7}}
METHODS = ["none", "global_standardization", "class_balanced_restandardization", "bbse", "saerens_em",
           "oracle_restandardization"]


def config():
    return {"encoders": ["enc1", "enc2"], "datasets": ["d"],
            "tasks": {"t": {"datasets": ["d"], "domains": ["s", "u", "v"]}},
            "prior_shift": {"task": "t", "source_domains": ["s"], "target_domains": ["u", "v"], "seeds": [0, 1],
                            "draws": 3, "sample_size": 40, "priors": PRIORS, "methods": METHODS}}


def domain_arrays(domain, n=90, d=6, seed=0):
    rng = np.random.default_rng([seed, ord(domain)])
    means = np.random.default_rng(seed).normal(scale=1.5, size=(3, d))
    y = np.repeat(np.arange(3), n // 3)
    shift = 0 if domain == "s" else rng.normal(size=d)
    return means[y] + rng.normal(size=(y.size, d)) + shift, y


def run_job(runs, job, **kw):
    xs, ys = domain_arrays(job["source_domain"])
    xt, yt = domain_arrays(job["target_domain"])
    part = runs[(runs["encoder"] == job["encoder"]) & (runs["target_domain"] == job["target_domain"])]
    return run_prior_shift_shard(part, xs, ys, xt, yt, PRIORS, CLASSES, 40, METHODS, **kw)


def test_each_shard_produces_exactly_its_runs_times_methods():
    runs = grid.prior_shift_runs(config())
    jobs = grid.jobs(runs, "prior_shift")
    assert len(jobs) == 4 and len(runs) == 2 * 2 * 2 * 2 * 3
    out = pd.concat([run_job(runs, job) for job in jobs.to_dict(orient="records")], ignore_index=True)
    keys = ["task", "encoder", "source_domain", "target_domain", "seed", "prior", "draw"]
    assert len(out) == len(runs) * len(METHODS)
    expected = runs[keys].astype(str).merge(pd.DataFrame({"method": METHODS}), how="cross")
    got = out[[*keys, "method"]].astype(str)
    pd.testing.assert_frame_equal(got.sort_values(list(got.columns)).reset_index(drop=True),
                                  expected.sort_values(list(expected.columns)).reset_index(drop=True))
    assert (out.loc[out["method"] == "none", "gain_macro_f1"] == 0).all()
    assert (out["draw_seed"] == [draw_seed(r.seed, r.target_domain, r.prior, r.draw) for r in out.itertuples()]).all()
    assert set(out["deployable"][out["method"] == "oracle_restandardization"]) == {False}


def test_a_shard_row_is_reproducible_from_its_recorded_seed():
    runs = grid.prior_shift_runs(config())
    job = {"encoder": "enc2", "source_domain": "s", "target_domain": "v"}
    out = run_job(runs, job)
    row = out[(out["seed"] == 1) & (out["prior"] == "skewed") & (out["draw"] == 2) & (out["method"] == "none")].iloc[0]
    xs, ys = domain_arrays("s")
    xt, yt = domain_arrays("v")
    probe = SourceProbe(random_state=1).fit(xs, ys, n_classes=3)
    rows = resample_target(yt, prior_vector(PRIORS["skewed"], CLASSES), 40, [int(row["draw_seed"])]).index[0]
    P = metrics.softmax(probe.decision_logits(xt[rows]))
    assert row["macro_f1"] == pytest.approx(metrics.macro_f1(P, yt[rows]), abs=1e-9)
    # the shard fits every seed in one batched engine call: probabilities agree to the fit's tolerance
    assert row["ece_raw"] == pytest.approx(metrics.ece(P, yt[rows]), abs=1e-6)
    assert row["in_domain_macro_f1"] == pytest.approx(probe.val_macro_f1_)
    pd.testing.assert_frame_equal(out, run_job(runs, job))  # same seeds, same numbers


def test_one_hema_job_runs_the_presets_750_runs():
    """The hema preset's 33,750 evaluations per method are 45 jobs of 750 runs; one job end to end on small
    stand-in arrays (every preset method, the preset's sample size, priors, seeds and draws)."""
    preset = load_yaml(REPO_ROOT / "resources" / "presets" / "hema.yaml")
    registry = load_yaml(REPO_ROOT / "resources" / "datasets.yaml")
    runs = grid.prior_shift_runs(preset, registry)
    jobs = grid.jobs(runs, "prior_shift")
    assert len(runs) == 33_750 and len(jobs) == 45
    job = jobs.iloc[0].to_dict()
    part = runs[(runs["encoder"] == job["encoder"]) & (runs["target_domain"] == job["target_domain"])]
    assert len(part) == 750
    ps = preset["prior_shift"]
    classes = list(next(iter(ps["priors"].values())))
    rng = np.random.default_rng(0)
    means = rng.normal(size=(5, 8))
    ys = np.repeat(np.arange(5), 40)
    yt = np.repeat(np.arange(5), 60)
    out = run_prior_shift_shard(part, means[ys] + rng.normal(size=(200, 8)), ys,
                                means[yt] + rng.normal(size=(300, 8)) + 0.5, yt, ps["priors"], classes,
                                ps["sample_size"], ps["methods"], shot_im={"epochs": 2})
    assert len(out) == 750 * len(ps["methods"])
    assert (out["n_items"] == 500).all()
    # 500 items from pools of 60 per class: the large classes are drawn with replacement, and say so
    assert out.loc[out["prior"] == "neutrophil-heavy", "classes_with_replacement"].eq("neutrophil").all()


def test_shard_rejects_bad_jobs_and_inputs():
    runs = grid.prior_shift_runs(config())
    xs, ys = domain_arrays("s")
    xt, yt = domain_arrays("u")
    with pytest.raises(FmauditInputError, match="one shard runs one"):
        run_prior_shift_shard(runs, xs, ys, xt, yt, PRIORS, CLASSES, 40, METHODS)
    one = runs[(runs["encoder"] == "enc1") & (runs["target_domain"] == "u")]
    with pytest.raises(FmauditInputError, match="not in prior_shift.priors"):
        run_prior_shift_shard(one, xs, ys, xt, yt, {"balanced": PRIORS["balanced"]}, CLASSES, 40, METHODS)
    with pytest.raises(FmauditInputError, match="target u features 4"):
        run_prior_shift_shard(one, xs, ys, xt[:, :4], yt, PRIORS, CLASSES, 40, METHODS)
    with pytest.raises(FmauditInputError, match="listed twice"):
        run_prior_shift_shard(pd.concat([one, one.iloc[:1]]), xs, ys, xt, yt, PRIORS, CLASSES, 40, METHODS)
    with pytest.raises(FmauditInputError, match="target u .*class 'c' has no items"):
        run_prior_shift_shard(one, xs, ys, xt[yt < 2], yt[yt < 2], PRIORS, CLASSES, 40, METHODS)
