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

from fmaudit.preflight.data import (
    FILE_CHECKS,
    MIN_TEST_GROUPS,
    ClassReference,
    DataChecks,
    check_class_references,
    check_data,
    check_files,
    check_test_groups,
    class_references,
    data_checks,
)
from fmaudit.preflight.plan import (
    check_config,
    check_encoder_weights,
    check_encoders_before_embedding,
    check_feature_imports,
    check_names,
    check_own_data,
    check_preparers,
    check_slide_sheets,
    feature_imports,
    registries,
    unusable_encoders,
)

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
    "check_files",
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
