"""File formats and atomic writes: the one place that knows how artefacts are laid out on disk.

Every writer goes to a temporary name in the destination folder and is renamed into place, so a killed
job never leaves a file that looks complete. A temporary file is hidden and named after its target and
its writer: ``.<target name>.<host>-<pid>.<random>.tmp<suffix>``. A killed job (SIGKILL, a node lost) leaves
it behind; the next :func:`write_npz` or :func:`write_table` to the same target removes it (and any other
leftover of that target whose writer is not a live process of this host: Snakemake never runs two jobs
for one output, so a temporary file of the same target from another host is a leftover too). Imports
nothing else of the project.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import pandas as pd

PathLike = str | os.PathLike


log = logging.getLogger(__name__)

_HOST = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host"
# what follows ".<target name>." in a temporary file's name: "<host>-<pid>.<random>.tmp<suffix>", or the
# "<random>.tmp<suffix>" of files written before the writer was part of the name
_TEMP_TAIL = re.compile(r"^(?:(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)\.)?[a-z0-9_]{8}\.tmp[^/]*$")


class FmauditInputError(ValueError):
    """Bad input: the message names the file, key or row at fault."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temps(path: PathLike) -> list[Path]:
    """Remove temporary files of ``path`` left by interrupted writes; return those removed.

    Kept: a temporary file whose writer is a live process of this host (a concurrent write in progress).
    Removed: every other one of this target (a dead writer here, or a writer on another host: one output
    has one writer at a time). Temporary files of other targets are not touched.

    Parameters
    ----------
    path : str or Path
        The target file whose leftovers (``.<name>.<host>-<pid>.<random>.tmp*`` in its folder) are looked for.

    Returns
    -------
    list of Path
        The temporary files removed (empty when the folder does not exist).
    """
    path = Path(path)
    prefix = f".{path.name}."
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except FileNotFoundError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        m = _TEMP_TAIL.match(entry.name[len(prefix):])
        if m is None:
            continue
        if m.group("host") == _HOST and _pid_alive(int(m.group("pid"))):
            continue
        try:
            os.unlink(entry.path)
        except FileNotFoundError:  # removed meanwhile by someone else
            continue
        removed.append(Path(entry.path))
        log.info("removed %s, left by an interrupted write of %s", entry.path, path)
    return removed


@contextlib.contextmanager
def atomic_path(path: PathLike, suffix: str | None = None, clean_stale: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds.

    ``clean_stale`` first removes leftovers of earlier interrupted writes of ``path``
    (:func:`remove_stale_temps`); it lists the folder, so writers of many small files leave it off.

    Parameters
    ----------
    path : str or Path
        The final file; its folder is created.
    suffix : str, optional
        Suffix of the temporary name (after ``.tmp``); default the suffix of ``path``, so writers that pick the
        format by extension (numpy, pyarrow) write the right one.
    clean_stale : bool, default False
        Remove leftovers of earlier interrupted writes of ``path`` first.

    Yields
    ------
    Path
        An empty temporary file beside ``path``; renamed onto ``path`` when the block exits normally, deleted when
        it raises.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if clean_stale:
        remove_stale_temps(path)
    suffix = path.suffix if suffix is None else suffix
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_HOST}-{os.getpid()}.", suffix=f".tmp{suffix}",
                               dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if tmp_path.exists():  # mkstemp makes 0600 files; give the result the permissions of a normal write
            os.chmod(tmp_path, 0o666 & ~_current_umask())
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`atomic_path`).

    Parameters
    ----------
    path : str or Path
        The file to write; its folder is created.
    text : str
        The whole content.
    """
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON with sorted keys, atomically; numpy scalars and arrays and paths are converted.

    Parameters
    ----------
    path : str or Path
        The file to write.
    obj : object
        JSON-able, numpy scalars, arrays and :class:`~pathlib.Path` included.

    Raises
    ------
    TypeError
        When a value cannot be converted to JSON.
    """
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_json(path: PathLike) -> Any:
    """Parse a JSON file.

    Parameters
    ----------
    path : str or Path
        The file.

    Returns
    -------
    object
        The decoded value.
    """
    return json.loads(Path(path).read_text())


def write_table(path: PathLike, df: pd.DataFrame, provenance: Mapping[str, Any] | None = None) -> None:
    """Write a DataFrame by extension (.parquet, .csv, .tsv, .md); parquet carries provenance metadata.

    Parameters
    ----------
    path : str or Path
        The table's file; the extension picks the format (any case).
    df : DataFrame
        The table; its index is not written.
    provenance : Mapping, optional
        JSON-able provenance, kept (as ``fmaudit_provenance`` schema metadata) by parquet only.

    Raises
    ------
    FmauditInputError
        For another extension.
    """
    path = Path(path)
    ext = path.suffix.lower()
    with atomic_path(path, clean_stale=True) as tmp:
        if ext == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.Table.from_pandas(df, preserve_index=False)
            if provenance:
                meta = dict(table.schema.metadata or {})
                meta[b"fmaudit_provenance"] = json.dumps(provenance, sort_keys=True, default=_json_default).encode()
                table = table.replace_schema_metadata(meta)
            pq.write_table(table, tmp)
        elif ext == ".csv":
            df.to_csv(tmp, index=False)
        elif ext == ".tsv":
            df.to_csv(tmp, index=False, sep="\t")
        elif ext == ".md":
            tmp.write_text(dataframe_to_markdown(df) + "\n")
        else:
            raise FmauditInputError(f"{path}: unknown table extension {ext!r} (use .parquet, .csv, .tsv or .md)")


def read_table(path: PathLike) -> pd.DataFrame:
    """Read a table written by :func:`write_table` (.parquet, .csv or .tsv; not .md).

    Parameters
    ----------
    path : str or Path
        The table's file.

    Returns
    -------
    DataFrame

    Raises
    ------
    FileNotFoundError
        When the file does not exist.
    FmauditInputError
        For another extension.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such table")
    ext = path.suffix.lower()
    if ext == ".parquet":
        return pd.read_parquet(path)
    if ext == ".csv":
        return pd.read_csv(path)
    if ext == ".tsv":
        return pd.read_csv(path, sep="\t")
    raise FmauditInputError(f"{path}: unknown table extension {ext!r}")


def read_provenance(path: PathLike) -> dict[str, Any]:
    """Provenance stored in a parquet file's schema metadata (empty dict if none).

    Parameters
    ----------
    path : str or Path
        A parquet file (only its schema is read).

    Returns
    -------
    dict
    """
    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    raw = meta.get(b"fmaudit_provenance")
    return json.loads(raw) if raw else {}


def dataframe_to_markdown(df: pd.DataFrame, floatfmt: str = ".3f") -> str:
    """A GitHub-flavoured Markdown table without the optional tabulate dependency.

    Parameters
    ----------
    df : DataFrame
        The table; its index is left out.
    floatfmt : str, default ".3f"
        Format spec of float cells; NaN is an empty cell. Pipes in other cells are escaped.

    Returns
    -------
    str
        Header, separator and one line per row, joined by newlines (no trailing newline).
    """
    def fmt(v: Any) -> str:
        if isinstance(v, (float, np.floating)):
            return "" if np.isnan(v) else format(float(v), floatfmt)
        return str(v).replace("|", "\\|")

    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(fmt(v) for v in row) + " |")
    return "\n".join(lines)


def write_npz(path: PathLike, arrays: Mapping[str, np.ndarray], provenance: Mapping[str, Any] | None = None) -> None:
    """Write arrays (and a JSON provenance string under key ``provenance``) to an .npz, atomically.

    Parameters
    ----------
    path : str or Path
        The ``.npz`` to write.
    arrays : Mapping of str to ndarray
        Arrays by name (``provenance`` is reserved); no object arrays (read back with ``allow_pickle=False``).
    provenance : Mapping, optional
        JSON-able provenance.
    """
    payload = dict(arrays)
    if provenance is not None:
        payload["provenance"] = np.array(json.dumps(provenance, sort_keys=True, default=_json_default))
    with atomic_path(path, suffix=".npz", clean_stale=True) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **payload)


def read_npz(path: PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Arrays and provenance of an .npz written by :func:`write_npz`.

    Parameters
    ----------
    path : str or Path
        The ``.npz`` file.

    Returns
    -------
    arrays : dict of str to ndarray
        Every array but ``provenance``, loaded.
    provenance : dict
        Empty when the file has none.

    Raises
    ------
    FileNotFoundError
        When the file does not exist.
    FmauditInputError
        When it is not a readable npz (e.g. a truncated write).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if k != "provenance"}
            prov = json.loads(str(z["provenance"])) if "provenance" in z.files else {}
    except (OSError, ValueError, EOFError) as e:  # zipfile.BadZipFile subclasses OSError? no: handle below
        raise FmauditInputError(f"{path}: unreadable npz ({e})") from e
    except Exception as e:  # zipfile.BadZipFile and friends
        raise FmauditInputError(f"{path}: unreadable npz ({e})") from e
    return arrays, prov


def read_npz_provenance(path: PathLike) -> dict[str, Any]:
    """Only the provenance of an .npz written by :func:`write_npz`; the arrays are not read.

    Parameters
    ----------
    path : str or Path
        The ``.npz`` file.

    Returns
    -------
    dict
        Empty when the file has none.

    Raises
    ------
    FileNotFoundError
        When the file does not exist.
    FmauditInputError
        When it is not a readable npz.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as z:  # members load lazily, on access
            return json.loads(str(z["provenance"])) if "provenance" in z.files else {}
    except Exception as e:  # zipfile.BadZipFile and friends
        raise FmauditInputError(f"{path}: unreadable npz ({e})") from e


H5_SUFFIXES = (".h5", ".hdf5")


def write_h5(path: PathLike, arrays: Mapping[str, np.ndarray], provenance: Mapping[str, Any] | None = None) -> None:
    """Write arrays to an HDF5 file, atomically: one dataset per key (``a/b`` makes group ``a``), string arrays
    as UTF-8 strings, and the provenance as a JSON string in the file's ``provenance`` attribute. This is the
    layout other WSI feature tools write (a ``features`` dataset) and :func:`load_feature_array` reads.

    Parameters
    ----------
    path : str or Path
        The ``.h5``/``.hdf5`` to write.
    arrays : Mapping of str to ndarray
        Datasets by key.
    provenance : Mapping, optional
        JSON-able provenance.
    """
    import h5py

    with atomic_path(path, clean_stale=True) as tmp:
        with h5py.File(tmp, "w") as f:
            for key, value in arrays.items():
                value = np.asarray(value)
                if value.dtype.kind in "UO":
                    f.create_dataset(key, data=value.astype(object), dtype=h5py.string_dtype())
                else:
                    f.create_dataset(key, data=value)
            if provenance is not None:
                f.attrs["provenance"] = json.dumps(provenance, sort_keys=True, default=_json_default)


def read_h5(path: PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Every dataset of an HDF5 file (``group/name`` keys; strings as str arrays) and its ``provenance``
    attribute (empty dict if none).

    Parameters
    ----------
    path : str or Path
        The HDF5 file.

    Returns
    -------
    arrays : dict of str to ndarray
    provenance : dict

    Raises
    ------
    FileNotFoundError
        When the file does not exist.
    FmauditInputError
        When it is not a readable HDF5 file.
    """
    import h5py

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    arrays: dict[str, np.ndarray] = {}
    try:
        with h5py.File(path, "r") as f:
            def visit(name, obj):
                if isinstance(obj, h5py.Dataset):
                    arrays[name] = obj.asstr()[()] if h5py.check_string_dtype(obj.dtype) else obj[()]

            f.visititems(visit)
            raw = f.attrs.get("provenance")
    except OSError as e:
        raise FmauditInputError(f"{path}: unreadable HDF5 file ({e})") from e
    arrays = {k: np.asarray(v, dtype=str) if isinstance(v, np.ndarray) and v.dtype == object else v
              for k, v in arrays.items()}
    return arrays, json.loads(raw) if raw else {}


def read_h5_provenance(path: PathLike) -> dict[str, Any]:
    """Only the ``provenance`` attribute of an HDF5 file (the datasets are not read).

    Parameters
    ----------
    path : str or Path
        The HDF5 file.

    Returns
    -------
    dict
        Empty when the file has none.

    Raises
    ------
    FileNotFoundError
        When the file does not exist.
    FmauditInputError
        When it is not a readable HDF5 file.
    """
    import h5py

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with h5py.File(path, "r") as f:
            raw = f.attrs.get("provenance")
    except OSError as e:
        raise FmauditInputError(f"{path}: unreadable HDF5 file ({e})") from e
    return json.loads(raw) if raw else {}


def load_feature_array(path: PathLike, key: str | None = None) -> np.ndarray:
    """Features brought from elsewhere: .npy, .npz (``key`` or the single array / ``features``),
    or HDF5 (.h5/.hdf5) with a ``features`` dataset (CLAM/TRIDENT style; (1,N,D) is squeezed).

    Parameters
    ----------
    path : str or Path
        A ``.npy``, ``.npz``, ``.h5`` or ``.hdf5`` file.
    key : str, optional
        The array (npz) or dataset (HDF5) to read; default ``features`` (or an npz's only array).

    Returns
    -------
    ndarray
        As stored, with a leading axis of length 1 of a 3-D array dropped.

    Raises
    ------
    FileNotFoundError
        When the file does not exist.
    FmauditInputError
        When the array cannot be chosen or is absent, or for another extension.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    ext = path.suffix.lower()
    if ext == ".npy":
        arr = np.load(path, allow_pickle=False)
    elif ext == ".npz":
        with np.load(path, allow_pickle=False) as z:
            names = [k for k in z.files if k != "provenance"]
            pick = key or ("features" if "features" in names else (names[0] if len(names) == 1 else None))
            if pick is None or pick not in names:
                raise FmauditInputError(f"{path}: choose an array with a key; it holds {names}")
            arr = z[pick]
    elif ext in (".h5", ".hdf5"):
        import h5py

        with h5py.File(path, "r") as f:
            pick = key or "features"
            if pick not in f:
                raise FmauditInputError(f"{path}: no dataset {pick!r} (has {list(f.keys())})")
            arr = f[pick][()]
    else:
        raise FmauditInputError(f"{path}: unknown feature file type {ext!r} (use .npy, .npz, .h5)")
    arr = np.asarray(arr)
    if arr.ndim == 3 and arr.shape[0] == 1:
        arr = arr[0]
    return arr


def sha256_file(path: PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes, read in blocks.

    Parameters
    ----------
    path : str or Path
        The file.
    chunk : int, default 1 MiB
        Bytes read at a time.

    Returns
    -------
    str
        64 hex digits.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def stable_hash(obj: Any, length: int = 16) -> str:
    """Hash of a JSON-able object with sorted keys: the config hash used in provenance.

    Parameters
    ----------
    obj : object
        JSON-able (numpy scalars, arrays and paths converted); dict key order does not matter.
    length : int, default 16
        Hex digits kept of the SHA-256.

    Returns
    -------
    str
    """
    blob = json.dumps(obj, sort_keys=True, default=_json_default).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def dataframe_hash(df: pd.DataFrame, length: int = 16) -> str:
    """Content hash of a table (column names, dtypes and values), independent of file format.

    Parameters
    ----------
    df : DataFrame
        The table; its index does not count, its column order does.
    length : int, default 16
        Hex digits kept of the SHA-256.

    Returns
    -------
    str
    """
    h = hashlib.sha256()
    h.update(json.dumps([list(map(str, df.columns)), [str(t) for t in df.dtypes]]).encode())
    h.update(pd.util.hash_pandas_object(df, index=False).values.tobytes())
    return h.hexdigest()[:length]


def provenance(**fields: Any) -> dict[str, Any]:
    """Provenance dict with the package version added.

    Parameters
    ----------
    **fields
        Provenance keys and JSON-able values.

    Returns
    -------
    dict
        ``fmaudit_version`` (the installed version, ``"0+unknown"`` from a source tree) followed by ``fields``.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        pkg = version("fmaudit")
    except PackageNotFoundError:  # running from a source tree
        pkg = "0+unknown"
    return {"fmaudit_version": pkg, **fields}
