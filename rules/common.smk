# What all rules files share (the config, the study's paths, the wildcards, the checks before the first job and
# the few helpers several branches use). Each branch's own plan, input functions and report registrations live
# beside its rules, in rules/<branch>_helpers.smk (included at the top of rules/<branch>.smk); rules hold no Python.

import inspect
import os
import sys
from pathlib import Path

from snakemake.utils import min_version

sys.path.insert(0, str(Path(workflow.basedir) / "src"))  # the workflow's own library, also without pip install

from fmaudit.cluster import FIXED_REQUESTS, RequestPlanner, parse_gpu_classes
from fmaudit.costs import job_gpus
from fmaudit.config import (
    embedded_encoders,
    fill_config,
    manifest_file,
    results_dir,
    weights_override as config_weights_override,
)
from fmaudit.preflight import check_config, unusable_encoders
from fmaudit.grid import config_block, task_domains
from fmaudit.io import FmauditInputError
from fmaudit.registry import embedding_key, unknown_name_error

try:  # the hook of Snakemake's own path helpers (see record_signatures)
    from snakemake.common import overwrite_function_params
except ImportError:  # another Snakemake: only the dry run's speed depends on it
    overwrite_function_params = None
from snakemake.dag import DAG

min_version("9.0")


# The built-in demo is the default config. A config given with --configfile (a preset, your own) replaces it
# instead of being merged into it, so no demo data set or task leaks into a real run.
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


try:
    # The config is filled from resources/schemas/config.schema.yaml once, here, exactly as the command line
    # fills it (fmaudit.config.fill_config): every default lives in the schema, and rules read config blocks as
    # they are. check_config is every check `fmaudit check-config` runs; ENCODERS is the registry as this
    # config sees it (encoder_revisions applied).
    fill_config(config)
    ENCODERS, DATASETS = check_config(config)
except (ValueError, FileNotFoundError) as err:
    raise WorkflowError(str(err))

# Everything this study writes goes under results/<study>/ (config `study`, default `demo`): studies live side
# by side in one checkout, and a study's report reads only its own files. Rules build every path from RESULTS.
RESULTS = results_dir(config)
REPORT = f"{RESULTS}/report"
# The data checks of the pre-flight (fmaudit.preflight.check_data), written once every manifest is prepared; every
# job that spends (embeddings, analysis shards) depends on it, so a leak, a class missing from training or an
# unknown class name in the config stops the run before the first embedding. See validated_splits().
VALIDATION = f"{RESULTS}/validation/preflight.tsv"
# What the report reads and states (rules/report.smk builds its inputs and params from the report chapters'
# declarations, fmaudit.report): each branch's helpers register its files under a report input name
# (fmaudit.report.REPORT_INPUTS) and its settings under a report setting name (fmaudit.report.REPORT_SETTINGS).
REPORT_INPUTS = {}
REPORT_SETTINGS = {}


wildcard_constraints:
    encoder=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    dataset=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    task=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    key=r"[0-9a-f]{12}",
    source_domain=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    target_domain=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    seed=r"[0-9]+",
    section=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    magnification=r"[0-9]+(\.[0-9]+)?",
    protocol=r"IS|IOCD|MOCV|LOOO",


# A perturbed copy of a test split (OOD tiers, rules/ood.smk) is a derived data set `<dataset>__<tag>`; tags of
# perturbations (fmaudit.ood.perturb.perturbation_tag) are what a derived manifest's name ends with.
PERTURBATION_KINDS = r"(?:blur_s|jpeg_q|exposure_f|pen_seed|bubble_seed|fold_seed)"
PERTURBATION_TAG = rf"{PERTURBATION_KINDS}[0-9.]+(?:_[0-9a-f]{{6}})?"
# a data set prepared from its source: a slug without `__<perturbation>` in it (a derived copy's name)
SOURCE_DATASET = rf"[A-Za-z0-9](?:(?!__{PERTURBATION_KINDS})[A-Za-z0-9._-])*"


def canonical(obj):
    """Dicts with sorted keys, recursively: Snakemake compares params by their printed form, so a rule must
    not rerun because a YAML file listed the same keys in another order."""
    if isinstance(obj, dict):
        return {k: canonical(obj[k]) for k in sorted(obj)}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    return obj


def config_name(kind, name, key):
    """``name`` when it is one of the config's ``key`` list (encoders, datasets, tasks); otherwise an error naming
    the config key, raised where Snakemake asked for a file of another name (a target given by hand)."""
    known = list(config[key]) + (list(config["variants"]) if key == "encoders" else [])
    if name not in known:
        raise unknown_name_error(kind, name, known, f"config {key!r}")
    return name


# ---- before the first job ------------------------------------------------------------------------------

# Rules that build an encoder (and so may run its remote code): a rule family that builds encoders adds its
# rule name here, so that a run stops before its first job when one of its encoders cannot be built.
ENCODER_BUILDING_RULES = {"embed", "cell_features"}

UNUSABLE_ENCODERS = unusable_encoders(config, ENCODERS)
if UNUSABLE_ENCODERS:
    # a dry run and `fmaudit grid` still show the plan; a run that would embed one of them stops (onstart)
    print(
        "fmaudit: warning: these encoders cannot be embedded yet; a run that embeds them stops before its "
        "first job:\n" + "\n".join(f"  - {why}" for why in UNUSABLE_ENCODERS.values()),
        file=sys.stderr,
    )


def check_before_first_job():
    """onstart (runs once the DAG is built, before any job; not on dry runs): stop if a job that would build an
    encoder is planned for an encoder that cannot be built as configured (fmaudit.preflight.unusable_encoders:
    remote code without a pinned commit, a registry weight file that is not there)."""
    planned = {
        job.wildcards.get("encoder") for job in workflow.dag.needrun_jobs() if job.rule.name in ENCODER_BUILDING_RULES
    }
    problems = [UNUSABLE_ENCODERS[enc] for enc in sorted(planned) if enc in UNUSABLE_ENCODERS]
    if problems:
        raise WorkflowError("stopped before the first job:\n" + "\n".join(problems))


# Before the first job of a run (not on dry runs): stop if a planned job would build an encoder that cannot be
# built as configured (remote code without a pinned commit: set encoder_revisions.<encoder>).
onstart:
    check_before_first_job()


def validated_splits():
    """The split validation as an input of every job that spends (embedding, analysis shards), as ancient(), so
    that a rerun of the checks (a task or manifest changed) does not by itself rerun what depends on them; those
    jobs rerun on their own inputs and parameters."""
    return ancient(VALIDATION)


# ---- paths every branch reads --------------------------------------------------------------------------


def manifest_path(dataset):
    return manifest_file(config, dataset)


def task_manifests(wildcards):
    return [manifest_path(ds) for ds in config["tasks"][wildcards.task]["datasets"]]


# The key of each encoder's embeddings: a hash of what decides their numbers (fmaudit.registry.EMBEDDING_KEYS:
# architecture, weights with their revision and sha256, preprocessing, readouts, precision) and of the config's
# encoder_weights override. Embeddings lie in a folder of that key: a change that alters the numbers writes a
# new folder and leaves the earlier embeddings where they were (a rerun that fails loses nothing; going back
# finds them done); an edit of a description or licence changes nothing.
def weights_override(encoder):
    """The config's local checkpoint for ``encoder`` ('' for none); a declared variant uses its base's."""
    return config_weights_override(config, ENCODERS, encoder) or ""


# Every encoder the config embeds: its encoders and their declared variants (`variants`, e.g. a resolution check)
EMBEDDED_ENCODERS = embedded_encoders(config)
EMBEDDING_KEY = {enc: embedding_key(ENCODERS[enc], weights_override(enc) or None) for enc in EMBEDDED_ENCODERS}


def embedding_path(encoder, dataset):
    """Where ``encoder``'s embeddings of ``dataset`` lie (every rule that reads embeddings asks here)."""
    return f"{RESULTS}/embeddings/{encoder}/{EMBEDDING_KEY[encoder]}/{dataset}.npz"


# ---- settings several branches read --------------------------------------------------------------------

# A task's keys read by every analysis of its items: its data sets, its domains (resolved) and which split column
# it uses. Each branch adds the keys its own shards read (transfer: the probe grid; ordinal: the OOD chapter's
# QWK and grading tables); description, label_map and allow_missing_classes change no shard's number (the last
# only what the validate stage accepts).
TASK_KEYS = ("datasets", "domains", "split")


def task_spec(wildcards, keys=()):
    """The task's config entry, its TASK_KEYS and ``keys``, with its resolved domains."""
    spec = {k: v for k, v in config["tasks"][wildcards.task].items() if k in TASK_KEYS or k in keys}
    spec["domains"] = task_domains(config, wildcards.task, DATASETS)
    return canonical(spec)


def resolved_readout(readout, encoder):
    """A config's readout, with `default` resolved to this encoder's own default readout (its registry entry)."""
    return ENCODERS[encoder].get("default_readout", "cls") if readout == "default" else readout


def task_ece_bins(wildcards):
    """The task's ECE bins: all the OOD and prior-shift shards and the scratch reference read of its calibration
    block (the probe shards read all of it), so a K-shot or temperature setting reruns none of them."""
    return config_block(config, "calibration", task=wildcards.task)["ece_bins"]


def bootstrap_settings(wildcards):
    """What the shards' row intervals use: the paired count feeds only the report, so changing it reruns only
    the report."""
    settings = config_block(config, "bootstrap", task=wildcards.task)
    return canonical({key: settings[key] for key in ("n_boot", "seed")})


# ---- resources several branches share ------------------------------------------------------------------

# Every cluster job's memory and wall time, and a GPU job's GPU class, come from one planner
# (fmaudit.cluster.RequestPlanner, which `fmaudit grid --estimate` asks too): a GPU job's from a cost model of its
# encoder (registry: params_m, input size, precision) and its items (the manifest's rows, a cell section's patches,
# once prepared; a stated default before: a job's resources are evaluated again when it is submitted), a shard's
# from its rule's default; either from the benchmark files of an earlier run of the same rule and encoder when
# there are some, plus a margin. Memory and wall time grow with the attempt (retries). A job that names no
# planned request (a localrule) keeps its own numbers.
GPU_BATCH_SIZE = 64


def profile_default_resource(name):
    """The raw text of a default resource the profile (or --default-resources) sets, '' when none: the Slurm
    profile names the site's GPU classes there (gpu_classes; Slurm itself never reads it)."""
    defaults = workflow.resource_settings.default_resources
    for arg in getattr(defaults, "args", None) or []:
        key, _, value = str(arg).partition("=")
        if key.strip() == name:
            return value.strip().strip("'\"")
    return ""


try:
    PLANNER = RequestPlanner(
        ENCODERS,
        benchmarks=f"{RESULTS}/benchmarks",
        batch_size=GPU_BATCH_SIZE,
        gpu_classes=parse_gpu_classes(profile_default_resource("gpu_classes")),
    )
except FmauditInputError as err:
    raise WorkflowError(str(err))


def on_gpu(wildcards):
    """Whether the job's encoder runs on a GPU (its registry entry's `gpu`): the embedding and cell-feature
    jobs' GPU request, threads, memory and wall time follow it."""
    return bool(ENCODERS[wildcards.encoder].get("gpu", False))


def embed_gpus(wildcards):
    """The GPUs of an embedding or cell-feature job (fmaudit.costs.gpu_plan: what the cost report charges; GPU_PLAN
    is built in rules/report_helpers.smk, after every branch, and read when the job is planned)."""
    return job_gpus(GPU_PLAN, "embed", wildcards)


def embed_threads(wildcards):
    """Threads of an embedding job run without a profile's set-threads (a laptop, the demo, the tests): a GPU
    encoder's job gets two (the forward pass plus one decoding worker); a CPU-only entry (the demo's tiny
    random-init networks) gets one, because its job is mostly interpreter and library start-up, which is serial,
    so two such jobs side by side finish sooner than one job on two threads. Cluster profiles set their own."""
    return 2 if on_gpu(wildcards) else 1


def gpu_constraint(wildcards):
    """The Slurm constraint of the encoder's GPU class (the smallest of the profile's gpu_classes that holds its
    estimated GPU memory); None (no constraint) without classes or for a CPU-only encoder."""
    return PLANNER.gpu_constraint(wildcards.encoder)


def shard_mem_mb(wildcards, attempt, rulename):
    """A CPU shard's memory: its rule's default (fmaudit.cluster.SHARD_DEFAULTS), or the peak of this rule's earlier
    jobs for this encoder plus a margin (a shard of no encoder keeps the default)."""
    return PLANNER.shard(rulename, getattr(wildcards, "encoder", "")).at(attempt)[0]


def shard_runtime(wildcards, attempt, rulename):
    return PLANNER.shard(rulename, getattr(wildcards, "encoder", "")).at(attempt)[1]


def fixed_mem_mb(wildcards, attempt, rulename):
    """A data-preparation job's memory (fmaudit.cluster.FIXED_REQUESTS, per attempt)."""
    return FIXED_REQUESTS[rulename][0] * attempt


def fixed_runtime(wildcards, attempt, rulename):
    return FIXED_REQUESTS[rulename][1] * attempt


# ---- Snakemake internals -------------------------------------------------------------------------------

# Every spending job depends on the data checks as ancient() (validated_splits): a rerun of the checks alone
# reruns nothing after them. Snakemake 9 (DAG.update_needrun) first walks the DAG from the top and, when a
# job must run, skips the checks of every job downstream of it ("masked": they will run because their input
# is rebuilt); its second pass then does not start the jobs behind an ancient() input. A job behind the data
# checks was therefore never checked at all when the checks reran: a task edit (domains, transfer, a class
# name) or any edit made together with one (probe.C and allow_missing_classes) reran the checks and nothing
# else, leaving stale shards. The walk that masks stops at ancient() inputs here, so those jobs are checked on
# their own parameters, inputs and code like any other. tests/test_workflow.py edits every setting of the demo
# and checks what `snakemake -n` plans.
MASKING_SOURCE = "masked.update(self.bfs(self.depending, job))"


class NotBehindAncient:
    """``dag.depending`` without the edges where every file is an ancient() input that exists."""

    def __init__(self, depending):
        self.depending = depending

    def __getitem__(self, job):
        return {
            job_: files
            for job_, files in self.depending[job].items()
            if not all(f.is_ancient and os.path.exists(f) for f in files)
        }


def stop_masking_at_ancient_inputs():
    """Patch DAG.bfs for the one call that masks (see above); a Snakemake without that call is left as it is."""
    if MASKING_SOURCE not in inspect.getsource(DAG.update_needrun) or getattr(DAG.bfs, "fmaudit_patched", False):
        return
    bfs = DAG.bfs

    def bfs_masking_stops_at_ancient(self, direction, *jobs, **kwargs):
        if direction is self.depending and sys._getframe(1).f_code.co_name == "update_needrun":
            direction = NotBehindAncient(direction)
        return bfs(self, direction, *jobs, **kwargs)

    bfs_masking_stops_at_ancient.fmaudit_patched = True
    DAG.bfs = bfs_masking_stops_at_ancient


stop_masking_at_ancient_inputs()


# ---- the dry run's speed -------------------------------------------------------------------------------


def record_signatures(namespace):
    """Give every function of this workflow's files its parameters once.

    Snakemake reads a callable's signature (inspect.signature) every time it evaluates it: for each job's input,
    params, threads and resources, several times per job. On the CellPath preset (2,730 jobs, most of them
    feature jobs with five callables) that was seconds of the dry run. Every rules/<branch>_helpers.smk ends by
    calling this, so each helper's parameters are recorded once, through the hook Snakemake's own path helpers
    use (snakemake.common.overwrite_function_params). Only the dry run's speed depends on it."""
    if overwrite_function_params is None:
        return
    for value in list(namespace.values()):
        if inspect.isfunction(value) and value.__code__.co_filename.endswith((".smk", "Snakefile")):
            overwrite_function_params(value, inspect.signature(value).parameters)


record_signatures(globals())
