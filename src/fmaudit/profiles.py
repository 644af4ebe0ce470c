"""Installing the Slurm profile where Snakemake looks for named profiles, with the site's names checked.

``snakemake --profile NAME`` (or ``SNAKEMAKE_PROFILE=NAME``) looks for a folder ``NAME`` holding a
``config.yaml`` (or ``profile.yaml``), in this order: the working directory, the user config directory
``platformdirs.user_config_dir("snakemake", "snakemake")`` (``$XDG_CONFIG_HOME/snakemake``, by default
``~/.config/snakemake`` on Linux) and the site config directory (``/etc/xdg/snakemake``); see
``get_profile_dir`` in ``snakemake/cli.py`` (Snakemake 9). :func:`install_slurm_profile` writes to the
user config directory unless told otherwise, so ``snakemake --profile slurm`` works from any folder.

The installed profile is the repository's template (``profiles/slurm/config.yaml``) plus the site names,
each in one place:

- the account, as ``default-resources: slurm_account`` (``sbatch -A`` for every job);
- the rules whose jobs are resubmitted after a failure (``preemptible-rules``), from the table of analyses
  (:func:`fmaudit.grid.retried_rules`): the template lists the same rules for a reader, and a test keeps the two
  equal;
- the partitions, in ``partitions.yaml`` beside it, named by ``slurm-partition-config``: the Slurm plugin
  (snakemake-executor-plugin-slurm 2.8, ``partitions.py``) scores every job against the listed partitions
  and submits it to the best fit. The CPU partition has ``max_gpu: 0``, so a job that asks for a GPU
  (resources ``gpu > 0``, which the plugin turns into ``--gpus``) can only go to the GPU partition; a
  partition with GPUs scores lower for CPU-only jobs, which therefore go to the CPU partition.

Names are checked against ``sinfo`` (partitions, and whether the GPU partition has GPUs) and ``sacctmgr``
(then ``sshare``, as the plugin does at submission) when those commands exist; a name they do not list is
an error that lists the names they do. Where a command is missing or cannot answer (no accounting daemon),
the check says so and the name is written unchecked.
"""

from __future__ import annotations

import getpass
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs
import yaml

from fmaudit.cluster import ClusterSettings, parse_gpu_classes
from fmaudit.grid import retried_rules
from fmaudit.io import FmauditInputError, write_text
from fmaudit.schema import REPO_ROOT

TEMPLATE_RELPATH = Path("profiles") / "slurm" / "config.yaml"
PARTITIONS_FILE = "partitions.yaml"
# Most GPUs one job may ask for on the GPU partition when sinfo cannot tell: generous, because a job that
# asks for more than this falls back to the cluster's default partition.
UNKNOWN_GPUS_PER_NODE = 64
COMMAND_TIMEOUT_S = 30
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")
RETRIED_RULES_KEY = "preemptible-rules"


@dataclass
class SiteCheck:
    """One site name checked against the cluster: ``status`` is ok, unknown, not checked or warning.

    Parameters
    ----------
    what : str
        What the name is: ``partition``, ``GPU partition`` or ``account``.
    name : str
        The name as given.
    status : str
        ``ok``, ``unknown`` (the cluster lists other names), ``not checked`` (no command could tell) or ``warning``.
    detail : str
        Which command answered, or why none could; the names it lists when ``unknown``.
    """

    what: str
    name: str
    status: str
    detail: str

    def line(self) -> str:
        """The check as one line of the install's output.

        Returns
        -------
        str
            ``<what> '<name>': <status> (<detail>)``.
        """
        return f"{self.what} {self.name!r}: {self.status} ({self.detail})"


@dataclass
class InstalledProfile:
    """Where the profile went, the files written, what was checked, and how to use it.

    Parameters
    ----------
    dest : Path
        The profile folder written.
    files : list of Path
        The files written there (``config.yaml``, ``partitions.yaml``).
    checks : list of SiteCheck
        The site names' checks.
    profile_argument : str
        What to pass to ``snakemake --profile``: the folder's name when Snakemake finds it by name, else its path.
    """

    dest: Path
    files: list[Path]
    checks: list[SiteCheck] = field(default_factory=list)
    profile_argument: str = ""


def snakemake_profile_dir(name: str = "slurm") -> Path:
    """The folder ``snakemake --profile <name>`` finds from any working directory (the user config dir).

    Parameters
    ----------
    name : str
        The profile's name.

    Returns
    -------
    Path
        ``<user config dir>/snakemake/<name>`` (``~/.config/snakemake/<name>`` on Linux by default).
    """
    return Path(platformdirs.user_config_dir("snakemake", "snakemake")) / name


def default_template() -> Path:
    """``profiles/slurm/config.yaml`` of this source tree, else of the working directory.

    Returns
    -------
    Path

    Raises
    ------
    FileNotFoundError
        When neither holds the template.
    """
    for root in (REPO_ROOT, Path.cwd()):
        if (root / TEMPLATE_RELPATH).is_file():
            return root / TEMPLATE_RELPATH
    raise FileNotFoundError(
        f"{TEMPLATE_RELPATH}: the Slurm profile template was not found in {REPO_ROOT} or the working directory; "
        "run from the fmaudit repository or pass --template")


def _run(command: list[str]) -> tuple[int, str, str]:
    """Run a site command; (return code, stdout, stderr), or 127 when it cannot be started."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, "", str(e)
    return done.returncode, done.stdout, done.stderr


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


def slurm_partitions() -> tuple[dict[str, int] | None, str]:
    """Partitions sinfo lists, each with the most GPUs one of its nodes has (0: none); None when unknown.

    Returns
    -------
    tuple of (dict of str to int or None, str)
        Partition -> most GPUs per node (from the ``gpu`` GRES), or None; and ``"sinfo"`` or why sinfo could not
        tell.
    """
    if shutil.which("sinfo") is None:
        return None, "sinfo not found; run the install on a login node of the cluster to check the names"
    code, out, err = _run(["sinfo", "--noheader", "--format=%P|%G"])
    if code != 0:
        return None, f"sinfo failed: {_first_line(err) or f'exit {code}'}"
    partitions: dict[str, int] = {}
    for line in out.splitlines():
        if "|" not in line:
            continue
        name, gres = line.split("|", 1)
        name = name.strip().rstrip("*")
        gpus = 0
        for entry in gres.split(","):
            m = re.match(r"^\s*gpu(?::[^:(,]+)?:(\d+)", entry)
            if m:
                gpus = max(gpus, int(m.group(1)))
        partitions[name] = max(partitions.get(name, 0), gpus)
    if not partitions:
        return None, "sinfo listed no partitions"
    return partitions, "sinfo"


def slurm_accounts(user: str | None = None) -> tuple[set[str] | None, str]:
    """Accounts the user may submit under (lower case), as the Slurm plugin finds them; None when unknown.

    Parameters
    ----------
    user : str, optional
        The Slurm user; None: the current login name.

    Returns
    -------
    tuple of (set of str or None, str)
        The accounts, or None; and the command that listed them (``sacctmgr`` or ``sshare``) or why none could.
    """
    user = user or getpass.getuser()
    notes = []
    for command in (["sacctmgr", "--noheader", "--parsable2", "--associations", "list", "user", user,
                     "format=account"],
                    ["sshare", "-U", "--format=Account%256", "--noheader"]):
        if shutil.which(command[0]) is None:
            notes.append(f"{command[0]} not found")
            continue
        code, out, err = _run(command)
        if code != 0:
            notes.append(f"{command[0]} failed: {_first_line(err) or f'exit {code}'}")
            continue
        accounts = {a.strip().lower() for a in out.splitlines() if a.strip()}
        if accounts:
            return accounts, command[0]
        notes.append(f"{command[0]} listed no accounts for {user}")
    return None, "; ".join(notes)


def check_slurm_names(partition: str, gpu_partition: str, account: str) -> tuple[list[SiteCheck], int]:
    """Check the names against the cluster; return the checks and the GPUs per node of the GPU partition.

    Parameters
    ----------
    partition : str
        The partition for CPU jobs.
    gpu_partition : str
        The partition for GPU jobs (may equal ``partition``).
    account : str
        The Slurm account (compared case-insensitively).

    Returns
    -------
    tuple of (list of SiteCheck, int)
        One check per name (plus a warning when the GPU partition shows no GPUs), and the GPU partition's GPUs
        per node (:data:`UNKNOWN_GPUS_PER_NODE` when sinfo cannot tell or shows none).
    """
    checks = []
    partitions, source = slurm_partitions()
    gpus = UNKNOWN_GPUS_PER_NODE
    for what, name in (("partition", partition), ("GPU partition", gpu_partition)):
        if partitions is None:
            checks.append(SiteCheck(what, name, "not checked", source))
        elif name not in partitions:
            checks.append(SiteCheck(what, name, "unknown",
                                    f"{source} lists the partitions {', '.join(sorted(partitions))}"))
        else:
            checks.append(SiteCheck(what, name, "ok", source))
    if partitions is not None and gpu_partition in partitions:
        gpus = partitions[gpu_partition]
        if gpus == 0:
            gpus = UNKNOWN_GPUS_PER_NODE
            checks.append(SiteCheck("GPU partition", gpu_partition, "warning",
                                    "sinfo shows no gpu GRES on its nodes; GPU jobs ask for --gpus and may not start"))
        else:
            checks[-1].detail += f"; up to {gpus} GPU(s) per node"
    accounts, source = slurm_accounts()
    if accounts is None:
        checks.append(SiteCheck("account", account, "not checked", source))
    elif account.lower() not in accounts:
        checks.append(SiteCheck("account", account, "unknown", f"{source} lists {', '.join(sorted(accounts))}"))
    else:
        checks.append(SiteCheck("account", account, "ok", source))
    return checks, gpus


def render_slurm_profile(template: str, partition: str, gpu_partition: str, account: str, gpus_per_node: int,
                         header: str = "", gpu_classes: str = "") -> dict[str, str]:
    """The installed profile's files (name -> text): the template with the account (and the site's GPU classes,
    :func:`fmaudit.cluster.parse_gpu_classes`) and the partition file.

    Parameters
    ----------
    template : str
        The template's text (``profiles/slurm/config.yaml``), without account or partition.
    partition : str
        The partition for CPU jobs.
    gpu_partition : str
        The partition for GPU jobs.
    account : str
        The Slurm account.
    gpus_per_node : int
        The GPU partition's ``max_gpu``.
    header : str
        Comment lines put first in ``config.yaml``.
    gpu_classes : str
        The site's GPU classes (``"16:,80:a100_80g"``); '' writes none.

    Returns
    -------
    dict of str to str
        ``config.yaml`` and ``partitions.yaml`` -> their text; ``preemptible-rules`` is replaced by
        :func:`fmaudit.grid.retried_rules`.

    Raises
    ------
    FmauditInputError
        When the template names an account or partition itself, lacks one top-level ``default-resources`` or
        ``preemptible-rules``, or ``gpu_classes`` does not parse.
    """
    parsed = yaml.safe_load(template) or {}
    defaults = parsed.get("default-resources") or {}
    if "slurm_account" in defaults or "slurm_partition" in defaults or "slurm-partition-config" in parsed:
        raise FmauditInputError("the profile template already names an account or partition; it must not, "
                                "so that the installed profile holds each site name in one place")
    lines = template.splitlines()
    anchors = [i for i, line in enumerate(lines) if re.fullmatch(r"default-resources:\s*", line)]
    if len(anchors) != 1:
        raise FmauditInputError("the profile template needs exactly one top-level 'default-resources:' mapping")
    account_lines = [
        "  # Your Slurm account, for every job (sbatch -A); written by fmaudit profile install.",
        f"  slurm_account: {_yaml_scalar(account)}",
    ]
    if gpu_classes:
        parse_gpu_classes(gpu_classes)  # an error names the bad item before anything is written
        account_lines += [
            "  # Your site's GPU classes (GPU memory in GB: constraint), see gpu_classes below; written by fmaudit",
            "  # profile install --gpu-classes.",
            f"  gpu_classes: {_yaml_scalar(gpu_classes)}",
        ]
    lines[anchors[0] + 1:anchors[0] + 1] = account_lines
    lines = _with_retried_rules(lines, retried_rules())
    lines += [
        "",
        "# Partitions (written by fmaudit profile install): jobs that ask for a GPU (resources gpu > 0, e.g.",
        f"# embed for GPU encoders) go to {gpu_partition!r}, every other job to {partition!r}. The Slurm plugin",
        f"# picks between the partitions of {PARTITIONS_FILE} by each job's resources; a rule or a",
        "# set-resources entry with slurm_partition overrides it for that rule.",
        f"slurm-partition-config: {PARTITIONS_FILE}",
    ]
    config = (header + "\n" if header else "") + "\n".join(lines) + "\n"
    limits = {partition: {"max_gpu": 0}} if partition != gpu_partition else {}
    limits[gpu_partition] = {"max_gpu": int(gpus_per_node)}
    partitions = (
        "# Partitions of this cluster for snakemake-executor-plugin-slurm (written by fmaudit profile install).\n"
        "# The plugin submits each job to the best-fitting partition: a job that asks for GPUs only to one whose\n"
        "# max_gpu (GPUs one job may ask for) covers it, a CPU-only job preferably to one without GPUs.\n"
        + yaml.safe_dump({"partitions": limits}, sort_keys=False)
    )
    rendered = yaml.safe_load(config)
    if rendered.get("default-resources", {}).get("slurm_account") != account:
        raise FmauditInputError("could not place slurm_account under default-resources of the template")
    if gpu_classes and rendered["default-resources"].get("gpu_classes") != gpu_classes:
        raise FmauditInputError("could not place gpu_classes under default-resources of the template (it must not "
                                "set its own)")
    return {"config.yaml": config, PARTITIONS_FILE: partitions}


def template_retried_rules(template: str) -> list[str]:
    """The rules a profile template resubmits (its ``preemptible-rules``).

    Parameters
    ----------
    template : str
        The text of a profile's ``config.yaml``.

    Returns
    -------
    list of str
    """
    return list((yaml.safe_load(template) or {}).get(RETRIED_RULES_KEY) or [])


def _with_retried_rules(lines: list[str], rules: list[str]) -> list[str]:
    """The template's lines with its ``preemptible-rules`` list replaced by ``rules`` (the table of analyses'),
    so an installed profile retries every rule the workflow's analyses say can fail for resources."""
    starts = [i for i, line in enumerate(lines) if re.fullmatch(rf"{RETRIED_RULES_KEY}:\s*", line)]
    if len(starts) != 1:
        raise FmauditInputError(f"the profile template needs exactly one top-level '{RETRIED_RULES_KEY}:' list")
    end = starts[0] + 1
    while end < len(lines) and re.match(r"\s+-\s", lines[end]):
        end += 1
    return lines[:starts[0] + 1] + [f"  - {rule}" for rule in rules] + lines[end:]


def _yaml_scalar(value: str) -> str:
    """A YAML scalar that reads back as the string ``value`` (quoted when YAML would read a number)."""
    return yaml.safe_dump(value).splitlines()[0]


def install_slurm_profile(dest: str | Path | None, partition: str, gpu_partition: str, account: str, *,
                          template: str | Path | None = None, force: bool = False,
                          check: bool = True, gpu_classes: str = "") -> InstalledProfile:
    """Write the Slurm profile to ``dest`` (default: where ``snakemake --profile slurm`` finds it).

    Refuses to replace an existing profile unless ``force``. With ``check`` (default), an account or
    partition that ``sacctmgr``/``sshare``/``sinfo`` do not list is an error naming what they list; without
    it, the names are written as given. ``gpu_classes``: the site's GPU classes (``"16:,80:a100_80g"``, see
    docs/cluster.md), written under default-resources.

    Parameters
    ----------
    dest : path-like or None
        The profile folder; None: :func:`snakemake_profile_dir` ``("slurm")``.
    partition : str
        The partition for CPU jobs.
    gpu_partition : str
        The partition for GPU jobs.
    account : str
        The Slurm account.
    template : path-like, optional
        The template; None: :func:`default_template`.
    force : bool
        Replace an installed profile.
    check : bool
        Check the names with ``sinfo``, ``sacctmgr`` and ``sshare``.
    gpu_classes : str
        The site's GPU classes; '' writes none.

    Returns
    -------
    InstalledProfile

    Raises
    ------
    FmauditInputError
        For a name that is not a Slurm name, a profile already there without ``force``, or (with ``check``) a
        name the cluster does not list; nothing is written then.
    FileNotFoundError
        When the template does not exist.
    """
    for what, name in (("--partition", partition), ("--gpu-partition", gpu_partition), ("--account", account)):
        if not _SLURM_NAME.match(name or ""):
            raise FmauditInputError(f"{what} {name!r}: not a Slurm name (letters, digits, '_', '-', '.', '+')")
    dest_path = Path(dest).expanduser() if dest else snakemake_profile_dir("slurm")
    existing = [p for p in (dest_path / "config.yaml", dest_path / "profile.yaml", dest_path / PARTITIONS_FILE)
                if p.exists()]
    if existing and not force:
        raise FmauditInputError(f"{dest_path}: a profile is already installed there ({existing[0].name}); "
                                "pass --force to replace it")
    template_path = Path(template) if template else default_template()
    if not template_path.is_file():
        raise FileNotFoundError(f"{template_path}: profile template not found")
    if check:
        checks, gpus = check_slurm_names(partition, gpu_partition, account)
        unknown = [c for c in checks if c.status == "unknown"]
        if unknown:
            raise FmauditInputError(
                "unknown Slurm name(s); nothing was written:\n" + "\n".join(f"  {c.line()}" for c in unknown)
                + "\n(pass --no-check to write them anyway, e.g. when installing away from the cluster)")
    else:
        checks = [SiteCheck(what, name, "not checked", "--no-check") for what, name in
                  (("partition", partition), ("GPU partition", gpu_partition), ("account", account))]
        gpus = UNKNOWN_GPUS_PER_NODE
    header = (f"# Installed by `fmaudit profile install slurm --partition {partition} --gpu-partition "
              f"{gpu_partition} --account {account}`\n# from {template_path}; run it again with --force to "
              "change the names.")
    if gpu_classes:
        header += f"\n# GPU classes: --gpu-classes {gpu_classes!r}"
    files = render_slurm_profile(template_path.read_text(), partition, gpu_partition, account, gpus, header=header,
                                 gpu_classes=gpu_classes)
    written = []
    for name, text in files.items():
        write_text(dest_path / name, text)
        written.append(dest_path / name)
    argument = dest_path.name if dest_path == snakemake_profile_dir(dest_path.name) else str(dest_path)
    return InstalledProfile(dest_path, written, checks, profile_argument=argument)


# ---- reading a profile back (fmaudit grid --estimate) -------------------------------------------------------

PROFILE_FILES = ("config.yaml", "profile.yaml")


def profile_file(profile: str | Path) -> Path:
    """The config file of a profile given as Snakemake takes it: a folder (or its config file), or a name looked
    up in the working directory, then the user and the site config directories (``get_profile_dir`` of
    snakemake/cli.py).

    Parameters
    ----------
    profile : str or path-like
        A profile name, folder or config file.

    Returns
    -------
    Path
        Its ``config.yaml`` (or ``profile.yaml``).

    Raises
    ------
    FmauditInputError
        Naming the folders looked in when none holds one.
    """
    candidate = Path(profile).expanduser()
    folders = [candidate] if candidate.is_absolute() or candidate.exists() or "/" in str(profile) else [
        Path.cwd() / str(profile), snakemake_profile_dir(str(profile)),
        Path(platformdirs.site_config_dir("snakemake", "snakemake")) / str(profile)]
    for folder in folders:
        if folder.is_file():
            return folder
        for name in PROFILE_FILES:
            if (folder / name).is_file():
                return folder / name
    raise FmauditInputError(f"profile {str(profile)!r}: no {' or '.join(PROFILE_FILES)} in "
                            f"{', '.join(str(f) for f in folders)}")


def _pairs(value: Any, key: str, where: Path) -> dict[str, Any]:
    """A profile value Snakemake reads as KEY=VALUE items: a mapping, or a list of 'KEY=VALUE' strings."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        out = {}
        for item in value:
            name, sep, text = str(item).partition("=")
            if not sep:
                raise FmauditInputError(f"{where}: {key} item {item!r} is not KEY=VALUE")
            out[name.strip()] = text.strip()
        return out
    raise FmauditInputError(f"{where}: {key} must be a mapping or a list of KEY=VALUE")


def _number(value: Any) -> float | None:
    """A resource value at attempt 1: a number, or an arithmetic expression of ``attempt``; None otherwise."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip().strip("'\"")
    if not re.fullmatch(r"[0-9attemp\s.*+/()-]+", text):
        return None
    try:
        result = eval(text, {"__builtins__": {}}, {"attempt": 1})  # digits, operators and `attempt` only
    except (SyntaxError, NameError, TypeError, ZeroDivisionError):
        return None
    return float(result) if isinstance(result, (int, float)) else None


def read_profile(profiles: list[str | Path] | tuple[str | Path, ...]) -> ClusterSettings:
    """What the estimate needs of one or more profiles, layered as ``snakemake --profile a --profile b`` does
    (each top-level key of a later profile replaces the same key of an earlier one): group-components,
    set-threads, set-resources (numbers: mem_mb, runtime, gpu) and the GPU classes of default-resources.

    Parameters
    ----------
    profiles : list or tuple of str or path-like
        Profiles in the order given to Snakemake (each as :func:`profile_file` takes it).

    Returns
    -------
    ClusterSettings
        ``group_components`` and ``threads`` (rule -> int), ``overrides`` (rule -> resource -> number, for
        ``mem_mb`` in MB, ``runtime`` in minutes and ``gpu``; values at attempt 1), ``gpu_classes`` and ``source``
        (the files read).

    Raises
    ------
    FmauditInputError
        For a missing profile or a malformed ``KEY=VALUE`` item.
    """
    merged: dict[str, Any] = {}
    files = []
    for profile in profiles:
        path = profile_file(profile)
        files.append(path)
        merged.update(yaml.safe_load(path.read_text()) or {})
    where = files[-1] if files else Path("profile")
    components = {k: int(v) for k, v in _pairs(merged.get("group-components"), "group-components", where).items()}
    threads = {k: int(v) for k, v in _pairs(merged.get("set-threads"), "set-threads", where).items()}
    overrides: dict[str, dict[str, float]] = {}
    for rule, resources in _pairs(merged.get("set-resources"), "set-resources", where).items():
        if isinstance(resources, str):  # "rule:resource=value" items
            resources = dict([resources.split("=", 1)])
        numbers = {name: _number(value) for name, value in dict(resources).items()
                   if name in ("mem_mb", "runtime", "gpu")}
        overrides[rule] = {name: v for name, v in numbers.items() if v is not None}
    defaults = _pairs(merged.get("default-resources"), "default-resources", where)
    return ClusterSettings(group_components=components, threads=threads, overrides=overrides,
                           gpu_classes=parse_gpu_classes(str(defaults.get("gpu_classes") or "")),
                           source=" + ".join(str(f) for f in files) or "no profile")
