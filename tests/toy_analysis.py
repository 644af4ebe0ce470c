"""A toy analysis added to a copy of the repository through the path docs/contributing.md ("A new analysis")
lists, file by file: its config block, run grid, computation, job, script, rules and helpers, report chapter
and caption, one line or a few in each shared table (analyses, Snakefile, report chapters, report summaries,
the cluster profile's retried rules), and the settings page regenerated.

The toy: the mean L2 norm of one encoder's embeddings of a task's data sets (its default readout), times
``toy.scale``; one job per (encoder, task), one report table. :func:`add_toy_analysis` writes it into a
repository copy and returns the files it touched (paths relative to the copy).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

NAME = "toy"
RULE = "toy_shard"
TABLE = "toy_norms"
PLACEHOLDERS = {"<analysis>": NAME, "<rule>": RULE, "<table>": TABLE}

SCHEMA_BLOCK = """\
  toy:
    type: object
    additionalProperties: false
    default: {}
    description: the toy analysis of tests/toy_analysis.py - the mean embedding norm of each encoder on each task.
    x-reruns: [toy_shard, report]
    properties:
      scale:
        type: number
        exclusiveMinimum: 0
        default: 1.0
        description: factor the mean norms are multiplied by.
"""

NEW_FILES = {
    "src/fmaudit/grid/toy.py": '''\
"""The toy analysis's run grid: one run per (encoder, task) of the probe grid."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from fmaudit.grid.probe import shards

__all__ = ["toy_runs"]


def toy_runs(config: Mapping[str, Any], dataset_registry: Mapping[str, Any] | None = None) -> pd.DataFrame:
    return pd.DataFrame([(s.encoder, s.task) for s in shards(config)], columns=["encoder", "task"])
''',
    "src/fmaudit/analyses/toy.py": '''\
"""The toy analysis's numbers: the mean L2 norm of embeddings, scaled."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

__all__ = ["mean_norm", "summarize_toy"]


def mean_norm(features: Sequence[np.ndarray], *, scale: float) -> float:
    return float(np.concatenate([np.linalg.norm(f.reshape(len(f), -1), axis=1) for f in features]).mean()) * scale


def summarize_toy(rows: pd.DataFrame | None) -> pd.DataFrame | None:
    return None if rows is None else rows.sort_values(["task", "encoder"]).reset_index(drop=True)
''',
    "src/fmaudit/jobs/toy.py": '''\
"""The toy analysis's job: one (encoder, task)."""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from fmaudit.analyses.toy import mean_norm
from fmaudit.embed import read_embeddings
from fmaudit.io import write_table
from fmaudit.logs import setup_logging

__all__ = ["toy_shard_job"]


def toy_shard_job(encoder: str, task: str, embeddings: Sequence[str], readout: str, scale: float, out: str,
                  log: str | None = None) -> None:
    logger = setup_logging(log)
    value = mean_norm([read_embeddings(p, readout)[1] for p in embeddings], scale=scale)
    write_table(out, pd.DataFrame({"encoder": [encoder], "task": [task], "mean_norm": [value]}))
    logger.info("%s on %s: mean norm %.4f", encoder, task, value)
''',
    "scripts/toy_shard.py": '''\
"""Snakemake adapter: the toy analysis of one (encoder, task)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parent / "src"))  # noqa: F821

from fmaudit.jobs.toy import toy_shard_job  # noqa: E402

toy_shard_job(
    encoder=snakemake.wildcards.encoder,  # noqa: F821
    task=snakemake.wildcards.task,  # noqa: F821
    embeddings=list(snakemake.input.embeddings),  # noqa: F821
    readout=snakemake.params.readout,  # noqa: F821
    scale=snakemake.params.toy["scale"],  # noqa: F821
    out=snakemake.output[0],  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
''',
    "rules/toy_helpers.smk": '''\
# Helpers of rules/toy.smk.

from fmaudit.grid import toy_runs

TOY_JOBS = list(toy_runs(config).itertuples(index=False))


def toy_inputs(wildcards):
    datasets = config["tasks"][config_name("task", wildcards.task, "tasks")]["datasets"]
    return {"embeddings": [embedding_path(wildcards.encoder, ds) for ds in datasets]}


def toy_readout(wildcards):
    return resolved_readout("default", wildcards.encoder)


def toy_settings(wildcards):
    return canonical(config["toy"])


REPORT_INPUTS["toy_shards"] = [f"{RESULTS}/shards/toy/{j.task}/{j.encoder}.parquet" for j in TOY_JOBS]
REPORT_SETTINGS["toy"] = canonical(config["toy"])


record_signatures(globals())
''',
    "rules/toy.smk": '''\
# The toy analysis: one job per (encoder, task).


include: "toy_helpers.smk"


rule toy_shard:
    input:
        unpack(toy_inputs),
        validated=validated_splits(),
    output:
        f"{RESULTS}/shards/toy/{{task}}/{{encoder}}.parquet",
    log:
        f"{RESULTS}/logs/toy_shard/{{task}}/{{encoder}}.log",
    params:
        readout=toy_readout,
        toy=toy_settings,
    threads: 1
    resources:
        mem_mb=shard_mem_mb,
        runtime=shard_runtime,
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/toy_shard.py"
''',
    "src/fmaudit/report/toy.py": '''\
"""The toy chapter of the report."""

from __future__ import annotations

import pandas as pd

from fmaudit.io import dataframe_to_markdown
from fmaudit.report.chapter import Chapter, ReportWriter

__all__ = ["CHAPTER"]


def write_toy_chapter(rows: pd.DataFrame | None, writer: ReportWriter) -> list[str]:
    rows = rows if rows is not None else pd.DataFrame({"note": ["no toy runs were planned"]})
    writer.table("toy_norms", rows)
    return ["## Toy", "", dataframe_to_markdown(rows), ""]


CHAPTER = Chapter("toy", {"toy_norms": "Toy"}, {}, write_toy_chapter, reads=("toy_shards",), settings=("toy",))
''',
    "resources/report/tables/toy_norms.rst": (
        "Mean L2 norm of each encoder's embeddings of each task's data sets (its default readout), "
        "times {{ snakemake.params.toy.scale }}.\n"),
}


def _insert(path: Path, anchor: str, text: str, after: bool = False) -> None:
    """Insert ``text`` before (or after) the one occurrence of ``anchor`` in ``path``."""
    source = path.read_text()
    assert source.count(anchor) == 1, f"{path}: the anchor {anchor!r} is not there once; update tests/toy_analysis.py"
    source = source.replace(anchor, anchor + text if after else text + anchor)
    path.write_text(source)


def add_toy_analysis(work: Path) -> set[str]:
    """Write the toy analysis into the repository copy ``work``; return the files it touched."""
    for rel, text in NEW_FILES.items():
        path = work / rel
        assert not path.exists(), f"{rel} exists already"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    _insert(work / "resources/schemas/config.schema.yaml", "  studies:\n", SCHEMA_BLOCK)
    analyses = work / "src/fmaudit/grid/analyses.py"
    _insert(analyses, "from fmaudit.io import FmauditInputError\n", "from fmaudit.grid.toy import toy_runs\n")
    source = analyses.read_text()
    table_end = re.search(r"\n\)\}\n", source[source.index("ANALYSES: dict"):])
    assert table_end, "grid/analyses.py: the end of ANALYSES not found"
    end = source.index("ANALYSES: dict") + table_end.start()
    analyses.write_text(source[:end] + '\n    Analysis("toy", toy_runs, ("encoder", "task"), rule="toy_shard"),'
                        + source[end:])
    _insert(work / "Snakefile", 'include: "rules/report.smk"\n', 'include: "rules/toy.smk"\n')
    chapters = work / "src/fmaudit/report/__init__.py"
    _insert(chapters, "from fmaudit.report import ", "toy, ", after=True)
    _insert(chapters, "    embeddings.CHAPTER,\n", "    toy.CHAPTER,\n", after=True)
    _insert(chapters, "REPORT_INPUTS: dict[str, str] = {\n",
            '    "toy_shards": "the toy analysis\'s shards",\n', after=True)
    _insert(chapters, "REPORT_SETTINGS: dict[str, str] = {\n", '    "toy": "the toy block",\n', after=True)
    summaries = work / "src/fmaudit/jobs/report.py"
    _insert(summaries, "from fmaudit.analyses.variants import", "from fmaudit.analyses.toy import summarize_toy\n")
    _insert(summaries, "#: Chapter name -> the function", (
        "def _toy(inputs: ReportInputs, settings: Mapping[str, Any], earlier: Mapping[str, Any]) -> Any:\n"
        "    return summarize_toy(inputs.table(\"toy_shards\"))\n\n\n"))
    _insert(summaries, '    "embeddings": _embeddings,\n', '    "toy": _toy,\n', after=True)
    _insert(work / "profiles/slurm/config.yaml", "  - cell_shard\n", "  - toy_shard\n", after=True)
    settings_page = work / "docs/settings.md"
    before = settings_page.read_text()
    subprocess.run([sys.executable, "-m", "fmaudit.cli", "docs", "settings"], cwd=work, check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(work / "src")})
    assert "`toy.scale`" in settings_page.read_text() and settings_page.read_text() != before
    return {*NEW_FILES, "resources/schemas/config.schema.yaml", "src/fmaudit/grid/analyses.py", "Snakefile",
            "src/fmaudit/report/__init__.py", "src/fmaudit/jobs/report.py", "profiles/slurm/config.yaml",
            "docs/settings.md"}


def contributing_files(doc: Path, heading: str = "## A new analysis") -> set[str]:
    """The files a section of docs/contributing.md lists (each list item that starts with a path in backticks),
    with the toy's names for the placeholders."""
    text = doc.read_text()
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    section = text[start:end if end >= 0 else None]
    paths = set()
    for match in re.finditer(r"^\s*(?:\d+\.|-) `([^`]+)`", section, re.MULTILINE):
        path = match.group(1)
        for placeholder, name in PLACEHOLDERS.items():
            path = path.replace(placeholder, name)
        paths.add(path)
    return paths
