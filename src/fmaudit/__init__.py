"""fmaudit: reliability audit of frozen pathology and hematology foundation-model encoders."""

__version__ = "0.1.0"
