"""Statistics of fmaudit (docs/methods.md#statistics): bootstrap resampling and metric kernels, confidence intervals,
rankings, meta-analysis and structured (two-way, hierarchical) bootstraps.

- :mod:`fmaudit.stats.bootstrap`: resample counts and vectorised metric kernels (``bootstrap_counts``,
  ``bootstrap_metric``, ``bootstrap_metric_models``).
- :mod:`fmaudit.stats.intervals`: ``percentile_interval``, ``cluster_bootstrap_ci``, paired differences,
  per-model tables, and the seed-mean bootstrap of a prediction cell (``cell_resample_counts``,
  ``seed_mean_bootstrap``).
- :mod:`fmaudit.stats.ranking`: ``rank_transfer``, ``spearman_rows``, ``wilcoxon_win``.
- :mod:`fmaudit.stats.meta`: ``fisher_z_meta`` (DerSimonian-Laird on Fisher z).
- :mod:`fmaudit.stats.hierarchical`: ``two_way_cluster_bootstrap``, ``hierarchical_bootstrap_mean``.

Every public name is re-exported here: ``from fmaudit.stats import bootstrap_counts``.
"""

# Each submodule's __all__ is the one list of its public names; the package re-exports them all.
from fmaudit.stats import bootstrap, hierarchical, intervals, meta, ranking
from fmaudit.stats.bootstrap import *
from fmaudit.stats.hierarchical import *
from fmaudit.stats.intervals import *
from fmaudit.stats.meta import *
from fmaudit.stats.ranking import *

__all__ = sorted([*bootstrap.__all__, *hierarchical.__all__, *intervals.__all__, *meta.__all__, *ranking.__all__])
