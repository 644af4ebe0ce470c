"""Statistics of fmaudit (METHODS 7): bootstrap resampling and metric kernels, confidence intervals, rankings,
meta-analysis and structured (two-way, hierarchical) bootstraps.

- :mod:`fmaudit.stats.bootstrap`: resample counts and vectorised metric kernels (``bootstrap_counts``,
  ``bootstrap_metric``, ``bootstrap_metric_models``).
- :mod:`fmaudit.stats.intervals`: ``percentile_interval``, ``cluster_bootstrap_ci``, paired differences,
  per-model tables, and the seed-mean bootstrap of a prediction cell (``cell_resample_counts``,
  ``seed_mean_bootstrap``).
- :mod:`fmaudit.stats.ranking`: ``rank_transfer``, ``wilcoxon_win``.
- :mod:`fmaudit.stats.meta`: ``fisher_z_meta`` (DerSimonian-Laird on Fisher z).
- :mod:`fmaudit.stats.hierarchical`: ``two_way_cluster_bootstrap``, ``hierarchical_bootstrap_mean``.

Every public name is re-exported here: ``from fmaudit.stats import bootstrap_counts``.
"""

from fmaudit.stats.bootstrap import (
    BOOTSTRAP_METRICS,
    bootstrap_counts,
    bootstrap_metric,
    bootstrap_metric_models,
    point_metric,
    resolve_metric,
    validated_models,
)
from fmaudit.stats.hierarchical import hierarchical_bootstrap_draws, hierarchical_bootstrap_mean, two_way_cluster_bootstrap
from fmaudit.stats.intervals import (
    bootstrap_ci_table,
    cell_resample_counts,
    cluster_bootstrap_ci,
    paired_bootstrap_diff,
    paired_bootstrap_matrix,
    percentile_interval,
    seed_mean_bootstrap,
)
from fmaudit.stats.meta import fisher_z_meta
from fmaudit.stats.ranking import rank_transfer, wilcoxon_win

__all__ = [
    "BOOTSTRAP_METRICS",
    "bootstrap_ci_table",
    "bootstrap_counts",
    "bootstrap_metric",
    "bootstrap_metric_models",
    "cell_resample_counts",
    "cluster_bootstrap_ci",
    "fisher_z_meta",
    "hierarchical_bootstrap_draws",
    "hierarchical_bootstrap_mean",
    "paired_bootstrap_diff",
    "paired_bootstrap_matrix",
    "percentile_interval",
    "point_metric",
    "rank_transfer",
    "resolve_metric",
    "seed_mean_bootstrap",
    "two_way_cluster_bootstrap",
    "validated_models",
    "wilcoxon_win",
]
