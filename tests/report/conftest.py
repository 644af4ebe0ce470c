"""The analyses' synthetic suite results, shared with the report tests."""

from analyses.conftest import suite_results  # noqa: F401  (a package-scoped fixture)
