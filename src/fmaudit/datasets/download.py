"""Downloading and unpacking public data sets, once, into ``data_root``.

- :func:`fetch` downloads to ``<dest>.part``, resumes an interrupted download with an HTTP ``Range``
  request, checks size and checksum, and renames the file into place only when it is complete and correct.
  ``file://`` URLs go through the same path (useful for mirrors on a shared file system, and for tests).
- :func:`unpack` extracts zip and tar archives (and single ``.gz`` files) refusing any member that would
  land outside the destination (absolute paths, ``..``, links pointing out, device files). It extracts into
  a temporary folder beside the destination and moves the result into place, then writes a marker, so an
  interrupted unpack is simply redone.
- :func:`download_dataset` does both for every ``files`` entry of a data-set registry entry.
- A file whose source publishes no sha256 gets one recorded at its first download, in a sidecar
  ``<file>.sha256`` (``sha256sum`` format) beside it; the value is printed once (a warning when the source
  publishes no checksum at all), and every later run checks the file against it, so a changed or
  corrupted file is noticed. :func:`downloaded_checksums` lists them for provenance.

Nothing here runs inside the workflow's compute jobs: GPU nodes are often air-gapped, so data sets are
fetched once, beforehand, by a person or a login-node job.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import re
import shutil
import stat
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

from fmaudit.io import FmauditInputError, write_text

log = logging.getLogger(__name__)

CHUNK = 1 << 20
USER_AGENT = "fmaudit-downloader"


def _digests(path: Path) -> tuple[str, str]:
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            sha.update(block)
            md5.update(block)
    return sha.hexdigest(), md5.hexdigest()


def verify_file(path: str | Path, sha256: str | None = None, md5: str | None = None,
                expected_size: int | None = None, url: str | None = None) -> str | None:
    """Raise :class:`FmauditInputError` if the file's size or checksums differ from the expected ones.

    Returns the file's sha256 when a checksum was checked (the digests are computed in one read), else None.

    Parameters
    ----------
    path : str or Path
        The file to check.
    sha256 : str, optional
        Expected hex sha256 (any case); None: not checked.
    md5 : str, optional
        Expected hex md5 (any case); None: not checked.
    expected_size : int, optional
        Expected size in bytes; None: not checked.
    url : str, optional
        Where the file came from, named in the error message.

    Returns
    -------
    str or None
        The file's hex sha256 when ``sha256`` or ``md5`` was given, else None (the size alone needs no read).

    Raises
    ------
    FmauditInputError
        When the size or a checksum differs, naming the file (and its URL) and both values.
    """
    path = Path(path)
    what = f"{path}" + (f" (from {url})" if url else "")
    size = path.stat().st_size
    if expected_size is not None and size != int(expected_size):
        raise FmauditInputError(f"{what}: size {size} bytes, expected {int(expected_size)}")
    if sha256 is None and md5 is None:
        return None
    got_sha, got_md5 = _digests(path)
    if sha256 is not None and got_sha != sha256.lower():
        raise FmauditInputError(f"{what}: sha256 {got_sha} does not match the expected {sha256.lower()}")
    if md5 is not None and got_md5 != md5.lower():
        raise FmauditInputError(f"{what}: md5 {got_md5} does not match the expected {md5.lower()}")
    return got_sha


def sha256_sidecar(path: str | Path) -> Path:
    """Where the sha256 of a download without a published one is recorded: ``<file>.sha256``.

    Parameters
    ----------
    path : Path
        The downloaded file (a ``Path``: its ``with_name`` is used).

    Returns
    -------
    Path
        ``<file>.sha256`` beside it, in ``sha256sum`` format (``<64 hex digits>  <file name>``).
    """
    path = Path(path)
    return path.with_name(path.name + ".sha256")


def _recorded_sha256(path: Path) -> str | None:
    sidecar = sha256_sidecar(path)
    if not sidecar.exists():
        return None
    fields = sidecar.read_text().split()
    if not fields or not re.fullmatch(r"[0-9a-f]{64}", fields[0]):
        raise FmauditInputError(f"{sidecar}: not a sha256 record ('<64 hex digits>  <file name>'); delete it to "
                                "record the file's sha256 again")
    return fields[0]


def _record_sha256(path: Path, sha: str, url: str, md5: str | None) -> None:
    """Write the sidecar and say so once: a warning when the source publishes no checksum at all."""
    sidecar = sha256_sidecar(path)
    write_text(sidecar, f"{sha}  {path.name}\n")
    if md5 is None:
        log.warning("%s: no published checksum; the sha256 of %s is %s (recorded in %s; later runs check "
                    "the file against it)", url, path.name, sha, sidecar)
    else:
        log.info("%s: md5 verified; sha256 %s recorded in %s", url, sha, sidecar)


def _verify_against_record(path: Path, md5: str | None, expected_size: int | None, url: str) -> None:
    """Check a file without a published sha256 against its recorded one (recording it if there is none)."""
    recorded = _recorded_sha256(path)
    if recorded is None:
        sha = verify_file(path, md5=md5, expected_size=expected_size, url=url) or _digests(path)[0]
        _record_sha256(path, sha, url, md5)
        return
    try:
        verify_file(path, sha256=recorded, md5=md5, expected_size=expected_size, url=url)
    except FmauditInputError as e:
        raise FmauditInputError(
            f"{e} (the sha256 recorded in {sha256_sidecar(path)} when the file was first downloaded); if the "
            f"source changed on purpose, delete both files to download and record it again") from e


def _open(url: str, offset: int, timeout: float):
    """Open ``url`` from byte ``offset``; return (stream, resumed, total size or None)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        src = Path(urllib.request.url2pathname(parsed.path))
        if not src.exists():
            raise FmauditInputError(f"{url}: no such file")
        fh = open(src, "rb")
        total = src.stat().st_size
        if 0 < offset <= total:
            fh.seek(offset)
            return fh, True, total
        return fh, False, total
    if parsed.scheme not in ("http", "https"):
        raise FmauditInputError(f"{url}: unsupported URL scheme {parsed.scheme!r} (use http, https or file)")
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    if offset > 0:
        req.add_header("Range", f"bytes={offset}-")
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset > 0:  # the part file already holds everything (or more)
            return None, True, None
        raise FmauditInputError(f"{url}: HTTP {e.code} {e.reason}") from e
    except urllib.error.URLError as e:
        raise FmauditInputError(f"{url}: cannot connect ({e.reason})") from e
    resumed = offset > 0 and resp.status == 206
    total = None
    if resumed:
        content_range = resp.headers.get("Content-Range", "")  # bytes a-b/total
        if "/" in content_range and content_range.rsplit("/", 1)[1].isdigit():
            total = int(content_range.rsplit("/", 1)[1])
    elif resp.headers.get("Content-Length", "").isdigit():
        total = int(resp.headers["Content-Length"])
    return resp, resumed, total


def fetch(
    url: str,
    dest: str | Path,
    sha256: str | None = None,
    expected_size: int | None = None,
    resume: bool = True,
    *,
    md5: str | None = None,
    timeout: float = 60.0,
) -> Path:
    """Download ``url`` to ``dest`` and return ``dest``.

    An existing ``dest`` that passes the given checks is kept (nothing is downloaded). Bytes go to
    ``dest.part`` first; with ``resume`` an existing part file is continued with ``Range: bytes=<size>-``
    (a server that ignores the range restarts the download from zero). After the transfer the size and
    checksums (``sha256``, ``md5``; either may be None when the source publishes none) are verified; a
    mismatch deletes the part file and raises :class:`FmauditInputError`. Only a verified file is renamed
    onto ``dest``.

    Parameters
    ----------
    url : str
        ``http``, ``https`` or ``file`` URL.
    dest : str or Path
        Where the verified file ends up; its folder is created.
    sha256 : str, optional
        Published hex sha256; None: the file's sha256 is recorded at the first download and checked later
        (:func:`sha256_sidecar`).
    expected_size : int, optional
        Published size in bytes; None: not checked.
    resume : bool
        Continue an existing ``dest.part`` with a range request (default true); false starts from zero.
    md5 : str, optional
        Published hex md5; None: not checked.
    timeout : float
        Seconds the connection may stall (default 60).

    Returns
    -------
    Path
        ``dest``.

    Raises
    ------
    FmauditInputError
        On an unsupported scheme, an HTTP or connection error, a missing ``file://`` file, or a size or checksum
        mismatch (with the file, or with the earlier recorded sha256).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        if sha256 is None:
            _verify_against_record(dest, md5, expected_size, url)
        else:
            verify_file(dest, sha256=sha256, md5=md5, expected_size=expected_size, url=url)
        log.info("%s: already present and verified", dest)
        return dest
    part = dest.with_name(dest.name + ".part")
    offset = part.stat().st_size if (resume and part.exists()) else 0
    if expected_size is not None and offset > int(expected_size):
        offset = 0  # a longer part file cannot be a prefix of the right one
    stream, resumed, total = _open(url, offset, timeout)
    if stream is not None:
        mode = "ab" if resumed else "wb"
        if offset and not resumed:
            log.info("%s: server ignored the range request; downloading from the start", url)
        done = offset if resumed else 0
        next_report = done + 256 * CHUNK
        with stream, open(part, mode) as out:
            while block := stream.read(CHUNK):
                out.write(block)
                done += len(block)
                if done >= next_report:
                    log.info("%s: %d MiB%s", dest.name, done >> 20, f" of {total >> 20} MiB" if total else "")
                    next_report = done + 256 * CHUNK
            out.flush()
            os.fsync(out.fileno())
        if total is not None and done != total:
            raise FmauditInputError(
                f"{url}: transfer ended at {done} of {total} bytes; run again to resume from {part}"
            )
    recorded = _recorded_sha256(dest) if sha256 is None else None  # an earlier copy of this file, since deleted
    try:
        got_sha = verify_file(part, sha256=sha256 or recorded, md5=md5, expected_size=expected_size, url=url)
    except FmauditInputError as e:
        part.unlink(missing_ok=True)
        if recorded is not None:
            raise FmauditInputError(f"{e} (recorded in {sha256_sidecar(dest)} at an earlier download)") from e
        raise
    os.replace(part, dest)
    if sha256 is None and recorded is None:
        _record_sha256(dest, got_sha or _digests(dest)[0], url, md5)
    log.info("%s: downloaded and verified", dest)
    return dest


# ---------------------------------------------------------------- unpacking

def _archive_kind(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".zip"):
        return "zip"
    if name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar")):
        return "tar"
    if name.endswith(".gz"):
        return "gz"
    raise FmauditInputError(f"{path}: unknown archive type (use .zip, .tar, .tar.gz, .tgz, .tar.bz2, .tar.xz or .gz)")


def _safe_member(archive: Path, name: str) -> PurePosixPath:
    """The member's relative path, or raise if it could land outside the destination."""
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise FmauditInputError(f"{archive}: member {name!r} has an absolute path; refusing to unpack")
    if ".." in p.parts:
        raise FmauditInputError(f"{archive}: member {name!r} points outside the destination; refusing to unpack")
    return p


def _check_tar(archive: Path, tf: tarfile.TarFile) -> None:
    for m in tf.getmembers():
        rel = _safe_member(archive, m.name)
        if m.isdev() or m.isfifo():
            raise FmauditInputError(f"{archive}: member {m.name!r} is a device or pipe; refusing to unpack")
        if m.issym() or m.islnk():
            target = PurePosixPath(m.linkname)
            resolved = target if m.islnk() else rel.parent / target
            if target.is_absolute() or ".." in PurePosixPath(os.path.normpath(str(resolved))).parts:
                raise FmauditInputError(
                    f"{archive}: link {m.name!r} -> {m.linkname!r} points outside the destination; refusing to unpack"
                )


def _check_zip(archive: Path, zf: zipfile.ZipFile) -> None:
    for info in zf.infolist():
        _safe_member(archive, info.filename)
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise FmauditInputError(f"{archive}: member {info.filename!r} is a symbolic link; refusing to unpack")


def _open_archive(opener, archive: Path, error: type[Exception], kind: str):
    """``opener(archive)``; a file that is not a valid archive of ``kind`` raises FmauditInputError naming it."""
    try:
        return opener(archive)
    except error as e:
        raise FmauditInputError(f"{archive}: not a valid {kind} file ({e})") from e


def unpack(archive: str | Path, dest_dir: str | Path) -> Path:
    """Extract ``archive`` into ``dest_dir`` safely and return ``dest_dir``.

    Zip, tar (optionally gz/bz2/xz) and single-file ``.gz`` (written as the name without ``.gz``).
    ``__MACOSX`` folders are skipped. A marker ``.fmaudit-unpacked-<archive name>`` in ``dest_dir`` records
    a finished unpack, and makes a second call a no-op. A top-level entry that already exists in
    ``dest_dir`` (from another source) stops the unpack with an error rather than being overwritten.

    Parameters
    ----------
    archive : str or Path
        A .zip, .tar, .tar.gz/.tgz, .tar.bz2, .tar.xz or single-file .gz archive.
    dest_dir : str or Path
        Folder the archive's top-level entries are moved into; created when missing.

    Returns
    -------
    Path
        ``dest_dir``.

    Raises
    ------
    FileNotFoundError
        When ``archive`` does not exist.
    FmauditInputError
        On an unknown archive type or a corrupt archive, a member with an absolute path, ``..``, a link pointing out or
        a device file, or a top-level entry that already exists in ``dest_dir``.
    """
    archive, dest_dir = Path(archive), Path(dest_dir)
    if not archive.exists():
        raise FileNotFoundError(f"{archive}: archive not found")
    dest_dir.mkdir(parents=True, exist_ok=True)
    marker = dest_dir / f".fmaudit-unpacked-{archive.name}"
    if marker.exists():
        log.info("%s: already unpacked into %s", archive, dest_dir)
        return dest_dir
    kind = _archive_kind(archive)
    tmp = Path(tempfile.mkdtemp(prefix=f".unpack-{archive.name}.", dir=dest_dir))
    try:
        if kind == "zip":
            with _open_archive(zipfile.ZipFile, archive, zipfile.BadZipFile, "zip") as zf:
                _check_zip(archive, zf)
                for info in zf.infolist():
                    if "__MACOSX" in PurePosixPath(info.filename).parts:
                        continue
                    zf.extract(info, tmp)
        elif kind == "tar":
            with _open_archive(tarfile.open, archive, tarfile.TarError, "tar") as tf:
                _check_tar(archive, tf)
                members = [m for m in tf.getmembers() if "__MACOSX" not in PurePosixPath(m.name).parts]
                if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: a second, standard guard
                    tf.extractall(tmp, members=members, filter="data")
                else:  # pragma: no cover - older Pythons; members were checked above
                    tf.extractall(tmp, members=members)
        else:
            out = tmp / archive.name[: -len(".gz")]
            try:
                with gzip.open(archive, "rb") as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst, CHUNK)
            except (OSError, EOFError) as e:
                raise FmauditInputError(f"{archive}: not a valid gzip file ({e})") from e
        entries = sorted(tmp.iterdir())
        clash = [e.name for e in entries if (dest_dir / e.name).exists()]
        if clash:
            raise FmauditInputError(
                f"{archive}: {dest_dir / clash[0]} already exists; remove it (or unpack elsewhere) and run again"
            )
        for e in entries:
            os.replace(e, dest_dir / e.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    marker.write_text(f"{archive}\n")
    log.info("%s: unpacked into %s", archive, dest_dir)
    return dest_dir


def gunzip(path: str | Path) -> Path:
    """Decompress ``x.gz`` to ``x`` beside it (atomically); return the decompressed path.

    Parameters
    ----------
    path : str or Path
        A ``.gz`` file; an existing decompressed file beside it is returned as is.

    Returns
    -------
    Path
        The decompressed file (``path`` without ``.gz``).

    Raises
    ------
    FmauditInputError
        When the name does not end in ``.gz`` or the file is not valid gzip.
    """
    path = Path(path)
    if not path.name.endswith(".gz"):
        raise FmauditInputError(f"{path}: not a .gz file")
    out = path.with_name(path.name[: -len(".gz")])
    if out.exists():
        return out
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with gzip.open(path, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK)
        os.replace(tmp, out)
    except (OSError, EOFError) as e:
        raise FmauditInputError(f"{path}: not a valid gzip file ({e})") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


# ---------------------------------------------------------------- registry entries

def _item_path(slug: str, item: Mapping[str, Any], data_root: Path) -> Path:
    name = item.get("name") or Path(urllib.parse.urlparse(item["url"]).path).name
    if item.get("unpack", False):
        return data_root / "downloads" / slug / name
    return data_root / (item.get("into") or "") / name


def downloaded_checksums(slug: str, entry: Mapping[str, Any], data_root: str | Path) -> list[dict[str, Any]]:
    """The sha256 of every downloaded file of a registry entry: ``published`` or ``recorded`` (sidecar), for
    provenance; files not downloaded (or recorded) yet have ``sha256`` None.

    Parameters
    ----------
    slug : str
        The data set's slug (archives lie under ``data_root/downloads/<slug>/``).
    entry : mapping
        Its registry entry; its ``files`` items are read.
    data_root : str or Path
        The data root the files were downloaded into.

    Returns
    -------
    list of dict
        One dict per ``files`` item: ``url``, ``path``, ``sha256`` (hex or None) and ``sha256_source`` (``published`` or
        ``recorded``).

    Raises
    ------
    FmauditInputError
        When a sidecar is not a valid sha256 record.
    """
    rows = []
    for item in entry.get("files") or []:
        path = _item_path(slug, item, Path(data_root))
        if item.get("sha256"):
            sha, how = str(item["sha256"]).lower(), "published"
        else:
            sha, how = _recorded_sha256(path), "recorded"
        rows.append({"url": item["url"], "path": str(path), "sha256": sha, "sha256_source": how})
    return rows


def download_dataset(slug: str, entry: Mapping[str, Any], data_root: str | Path, *, keep_archives: bool = True) -> Path:
    """Fetch and unpack every ``files`` item of a registry entry under ``data_root``; return ``data_root``.

    Each item: ``url``, ``name`` (file name to save as; default the URL's last path part), ``sha256``,
    ``md5`` and ``size_bytes`` (any may be null), ``unpack`` (bool) and ``into`` (folder under data_root,
    default data_root itself). Archives are kept in ``data_root/downloads/<slug>/`` unless
    ``keep_archives`` is false. Entries without files (registration, Kaggle, TCIA) raise with their
    ``how_to_get`` text.

    Parameters
    ----------
    slug : str
        The data set's slug, named in messages and in the archive folder.
    entry : mapping
        Its registry entry (``resources/datasets.yaml``): ``files`` and, for error messages, ``how_to_get``.
    data_root : str or Path
        Where the data sets live.
    keep_archives : bool
        Keep the downloaded archives after unpacking (default true).

    Returns
    -------
    Path
        ``data_root``.

    Raises
    ------
    FmauditInputError
        When the entry has no ``files`` (it says how to get the data set), and as :func:`fetch` and :func:`unpack`.
    """
    data_root = Path(data_root)
    files = entry.get("files") or []
    if not files:
        how = entry.get("how_to_get") or "see the data set's page"
        raise FmauditInputError(f"{slug}: cannot be downloaded automatically. {how}")
    for item in files:
        url = item["url"]
        into = data_root / (item.get("into") or "")
        checks = dict(sha256=item.get("sha256"), expected_size=item.get("size_bytes"), md5=item.get("md5"))
        if not item.get("unpack", False):
            fetch(url, _item_path(slug, item, data_root), **checks)  # straight to where the preparer reads it
            continue
        archive = fetch(url, _item_path(slug, item, data_root), **checks)
        unpack(archive, into)
        if not keep_archives:
            archive.unlink()
    return data_root
