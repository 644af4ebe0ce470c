"""Preparers of the real, public data sets the four papers use; importing this package registers them all.

Pathology (``pathology``): nct_crc_he, lc25000, breakhis, pcam, sicapv2, panda, mhist, bracs,
camelyon17_wilds; and (``extra``) lunghist700, spider_breast. Hematology (``hematology``): bloodmnist,
acevedo_pbc, matek19, raabin_wbc, mll23.
Each reads its release in the published layout under ``data_root``; a missing data set raises one
:class:`~fmaudit.io.FmauditInputError` saying where it was expected and where to get it.
"""

# registers the preparers (extra: lunghist700, spider_breast)
from fmaudit.datasets.public import extra, hematology, pathology
from fmaudit.datasets.public._common import WBC5_CLASSES, missing_data_error, safe_id
from fmaudit.datasets.public._xlsx import read_table_any, read_xlsx_stdlib
from fmaudit.datasets.public.hematology import WBC5_MAPS
from fmaudit.datasets.public.pathology import parse_breakhis_name, select_panda_slides, sicap_primary_label

__all__ = [
    "WBC5_CLASSES",
    "WBC5_MAPS",
    "missing_data_error",
    "parse_breakhis_name",
    "read_table_any",
    "read_xlsx_stdlib",
    "safe_id",
    "select_panda_slides",
    "sicap_primary_label",
]
