"""Cell-level analyses: Xenium sections, nucleus-anchored features, CellPath protocols."""
