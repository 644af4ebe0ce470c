"""``fmaudit cells``: Xenium sections on the command line.

    fmaudit cells register --bundle DIR --he-image FILE --alignment CSV [--cell-types CSV] --out cells.parquet
    fmaudit cells demo --out DIR [--sections 6] [--seed 0]

``register`` maps every cell of a 10x Xenium bundle onto the post-Xenium H&E image with the same code as
the workflow's preparer (:func:`fmaudit.cells.prepare.prepare_section`) and writes one row per registered
cell: ``cell_id``, ``he_x``, ``he_y`` (H&E level-0 pixels, x right, y down), ``centre_source`` and, with
``--cell-types``, ``label`` (the annotation's raw label). ``demo`` writes the demo sections (real Xenium
bundles built from the CC0 slide, see :mod:`fmaudit.cells.demo`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def cmd_register(args: argparse.Namespace) -> int:
    """Run ``fmaudit cells register``: one Xenium section's cells mapped onto its H&E image, written to ``--out``.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options of ``cells register`` (``bundle``, ``he_image``, ``alignment``, ``cell_types``, ``out``,
        ``manifest``, ``qc``, ``section``, ``organ``, ``he_mpp``, the taxonomy tables, ``min_cells_per_class``).

    Returns
    -------
    int
        Exit status 0; ``--out`` holds one row per registered cell (``cell_id``, ``he_x``, ``he_y`` in H&E level-0
        pixels, ``centre_source``, and ``label`` with ``--cell-types``).
    """
    # imported here: PIL and pyarrow load only when this runs
    from fmaudit.cells.prepare import SectionSource, prepare_section, registered_cells_table
    from fmaudit.cells.taxonomy import load_taxonomy
    from fmaudit.io import write_table

    source = SectionSource(section=args.section, organ=args.organ, bundle=Path(args.bundle),
                           he_image=Path(args.he_image), alignment=Path(args.alignment),
                           cell_types=Path(args.cell_types) if args.cell_types else None,
                           he_mpp=args.he_mpp)
    taxonomy = load_taxonomy(args.taxonomy_fine, args.taxonomy_coarse)
    result = prepare_section(source, taxonomy, args.min_cells_per_class, qc_png=args.qc)
    table = registered_cells_table(result, with_label=args.cell_types is not None)
    write_table(args.out, table, provenance=result.provenance if Path(args.out).suffix == ".parquet" else None)
    if args.manifest:
        write_table(args.manifest, result.manifest, provenance=result.provenance)
    counts = result.provenance["counts"]
    print(f"wrote {len(table)} cells to {args.out} ({counts['cells_outside_image_dropped']} of "
          f"{counts['cells_in_bundle']} outside the H&E image dropped; centres from {counts['centre_source']})")
    if not result.eligible:
        print(f"note: {result.exclusion_reason}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Run ``fmaudit cells demo``: the demo Xenium sections written under ``--out``, their list printed as JSON.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options of ``cells demo`` (``out``, ``sections``, ``organs`` comma-separated, ``seed``,
        ``window_px``, ``max_cells``, ``bundle_format``, ``zarr``).

    Returns
    -------
    int
        Exit status 0.
    """
    # imported here: pyarrow loads only when this runs
    from fmaudit.cells.demo import write_demo_sections

    sections = write_demo_sections(args.out, n_sections=args.sections, organs=args.organs.split(","), seed=args.seed,
                                   window_px=args.window_px, max_cells=args.max_cells, bundle_format=args.bundle_format,
                                   write_zarr=args.zarr)
    print(json.dumps(sections, indent=2))
    return 0


def register(subparsers) -> None:
    """Add ``fmaudit cells ...`` to the command line's subparsers.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The sub-parsers of :func:`fmaudit.cli.build_parser`; ``cells`` gets its own ``register`` and ``demo``.
    """
    cells = subparsers.add_parser("cells", help="Xenium sections: register cells on the H&E image, write demo sections")
    sub = cells.add_subparsers(dest="cells_command", required=True)

    reg = sub.add_parser("register", help="map a Xenium bundle's nuclei onto its post-Xenium H&E image")
    reg.add_argument("--bundle", required=True, help="10x Xenium output folder (experiment.xenium, cells.parquet ...)")
    reg.add_argument("--he-image", required=True, help="post-Xenium H&E image (pyramidal OME-TIFF)")
    reg.add_argument("--alignment", required=True, help="10x image-alignment CSV (3x3 affine, H&E px -> Xenium px)")
    reg.add_argument("--cell-types", help="annotation table with columns cell_id,label")
    reg.add_argument("--out", required=True, help="output table (.parquet, .csv, .tsv)")
    reg.add_argument("--manifest",
                     help="also write the full cell manifest (.parquet) with labels mapped by the taxonomy")
    reg.add_argument("--qc", help="also write a QC overlay PNG of sampled regions")
    reg.add_argument("--section", default="section", help="section id used in item ids and messages")
    reg.add_argument("--organ", default="unknown", help="organ of the section (manifest column)")
    reg.add_argument("--he-mpp", type=float, help="µm/px of the H&E level 0 when its metadata lack or misstate it")
    reg.add_argument("--taxonomy-fine", help="label -> fine class table (default resources/cells/taxonomy_fine.tsv)")
    reg.add_argument("--taxonomy-coarse",
                     help="fine -> coarse class table (default resources/cells/taxonomy_coarse.tsv)")
    reg.add_argument("--min-cells-per-class", type=int, default=10,
                     help="labelled cells a class needs to count as valid (eligibility: >= 2 valid classes)")
    reg.set_defaults(func=cmd_register)

    demo = sub.add_parser("demo",
                          help="write demo Xenium sections built from the CC0 slide, cell types planted at nuclei")
    demo.add_argument("--out", required=True, help="folder for the section folders and sections.json")
    demo.add_argument("--sections", type=int, default=6)
    demo.add_argument("--organs", default="organ-a,organ-b,organ-c",
                      help="comma-separated organ names, assigned in turn")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--window-px", type=int, default=1024, help="side of each section's H&E window, level-0 px")
    demo.add_argument("--max-cells", type=int, default=400)
    demo.add_argument("--bundle-format", choices=["v1", "v2"], default="v2",
                      help="v2: string cell ids, parquet tables; v1: integer ids, csv.gz tables")
    demo.add_argument("--zarr", action="store_true", help="also write cells.zarr.zip")
    demo.set_defaults(func=cmd_demo)
