"""``fmaudit profile install slurm``: the Slurm profile where ``snakemake --profile slurm`` finds it."""

from __future__ import annotations

import argparse

from fmaudit.profiles import install_slurm_profile


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``profile`` (with its ``install`` subcommand) to the ``fmaudit`` command line.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The sub-parsers of :func:`fmaudit.cli.build_parser`.
    """
    profile = subparsers.add_parser(
        "profile", help="install a Snakemake profile where `snakemake --profile NAME` finds it",
        description="Install the cluster profile once with your site's names; then `snakemake --profile slurm` "
                    "works from any folder.")
    actions = profile.add_subparsers(dest="profile_command", required=True)
    install = actions.add_parser(
        "install", help="write the Slurm profile with your partitions and account (checked with sinfo/sacctmgr)",
        description="Write profiles/slurm/config.yaml plus your account and partitions to the folder where "
                    "Snakemake looks for named profiles (the user config dir, e.g. ~/.config/snakemake/slurm; "
                    "$XDG_CONFIG_HOME moves it). GPU jobs go to --gpu-partition, all others to --partition.")
    install.add_argument("kind", choices=["slurm"], help="the profile to install")
    install.add_argument("--partition", required=True, help="Slurm partition of CPU jobs (sinfo lists them)")
    install.add_argument("--gpu-partition", required=True,
                         help="Slurm partition of jobs that ask for a GPU (may equal --partition)")
    install.add_argument("--account", required=True, help="Slurm account of every job (sacctmgr show assoc user=$USER)")
    install.add_argument("--dest", help="profile folder to write instead (then: snakemake --profile DEST)")
    install.add_argument("--template", help="profile template (default: profiles/slurm/config.yaml of fmaudit)")
    install.add_argument("--force", action="store_true", help="replace a profile already installed there")
    install.add_argument("--no-check", action="store_true",
                         help="write the names without checking them against sinfo/sacctmgr")
    install.add_argument("--gpu-classes", default="",
                         help="your GPU classes by GPU memory, e.g. '16:,80:a100_80g' (GB:constraint; an empty "
                              "constraint means any GPU): a GPU job gets the smallest class that holds its encoder")
    install.set_defaults(func=run_install)


def run_install(args: argparse.Namespace) -> int:
    """Run ``fmaudit profile install slurm``: write the profile with the site's names and print how to use it.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options of ``profile install`` (``partition``, ``gpu_partition``, ``account``, ``dest``,
        ``template``, ``force``, ``no_check``, ``gpu_classes``).

    Returns
    -------
    int
        Exit status 0 once the profile is written.

    Raises
    ------
    FmauditInputError
        When a name is not a Slurm name or fails its ``sinfo``/``sacctmgr`` check, or a profile is already
        installed there without ``--force``.
    """
    result = install_slurm_profile(args.dest, args.partition, args.gpu_partition, args.account,
                                   template=args.template, force=args.force, check=not args.no_check,
                                   gpu_classes=args.gpu_classes)
    for check in result.checks:
        print(check.line())
    for path in result.files:
        print(f"wrote {path}")
    print(f"use it with: snakemake --profile {result.profile_argument} [--configfile ...]")
    return 0
