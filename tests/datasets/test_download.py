"""fetch (HTTP with Range resume, file:// URLs, checksums), safe unpacking, registry downloads. No network:
a bounded http.server on 127.0.0.1 serves the test bytes and stops with the test."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import re
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from fmaudit.datasets.download import (
    download_dataset,
    downloaded_checksums,
    fetch,
    gunzip,
    sha256_sidecar,
    unpack,
    verify_file,
)
from fmaudit.io import FmauditInputError

PAYLOAD = bytes(range(256)) * 4096 + b"tail"  # ~1 MiB, not a multiple of the chunk size


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves PAYLOAD at /data.bin honouring single ``bytes=a-`` ranges; records every Range header."""

    payload = PAYLOAD
    ranges: list = []
    honour_range = True

    def do_GET(self):  # noqa: N802 - http.server API
        if self.path.split("?")[0] != "/data.bin":
            self.send_error(404)
            return
        rng = self.headers.get("Range")
        type(self).ranges.append(rng)
        data = self.payload
        m = re.fullmatch(r"bytes=(\d+)-", rng or "")
        if m and self.honour_range:
            start = int(m.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.end_headers()
                return
            body = data[start:]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            body = data
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # keep test output clean
        pass


@pytest.fixture()
def server():
    _RangeHandler.ranges = []
    _RangeHandler.honour_range = True
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RangeHandler)
    httpd.timeout = 5
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_fetch_http_verifies_and_renames(server, tmp_path):
    dest = tmp_path / "d" / "data.bin"
    out = fetch(f"{server}/data.bin", dest, sha256=sha(PAYLOAD), expected_size=len(PAYLOAD))
    assert out == dest and dest.read_bytes() == PAYLOAD
    assert not (tmp_path / "d" / "data.bin.part").exists()
    assert _RangeHandler.ranges == [None]


def test_fetch_resumes_from_part_file_with_range(server, tmp_path):
    dest = tmp_path / "data.bin"
    cut = 300_001
    (tmp_path / "data.bin.part").write_bytes(PAYLOAD[:cut])
    fetch(f"{server}/data.bin", dest, sha256=sha(PAYLOAD))
    assert dest.read_bytes() == PAYLOAD
    assert _RangeHandler.ranges == [f"bytes={cut}-"]


def test_fetch_restarts_when_server_ignores_range(server, tmp_path):
    _RangeHandler.honour_range = False
    dest = tmp_path / "data.bin"
    (tmp_path / "data.bin.part").write_bytes(b"garbage that is not a prefix")
    fetch(f"{server}/data.bin", dest, sha256=sha(PAYLOAD))
    assert dest.read_bytes() == PAYLOAD


def test_fetch_complete_part_file_gets_416_and_is_accepted(server, tmp_path):
    dest = tmp_path / "data.bin"
    (tmp_path / "data.bin.part").write_bytes(PAYLOAD)
    fetch(f"{server}/data.bin", dest, sha256=sha(PAYLOAD))
    assert dest.read_bytes() == PAYLOAD


def test_fetch_checksum_mismatch_raises_and_leaves_nothing(server, tmp_path):
    dest = tmp_path / "data.bin"
    with pytest.raises(FmauditInputError, match="sha256 .* does not match"):
        fetch(f"{server}/data.bin", dest, sha256="0" * 64)
    assert not dest.exists() and not (tmp_path / "data.bin.part").exists()
    with pytest.raises(FmauditInputError, match="md5"):
        fetch(f"{server}/data.bin", dest, md5="0" * 32)
    with pytest.raises(FmauditInputError, match="size"):
        fetch(f"{server}/data.bin", dest, expected_size=len(PAYLOAD) + 1)
    assert not dest.exists()


def test_fetch_md5_accepted_and_existing_file_not_redownloaded(server, tmp_path):
    dest = tmp_path / "data.bin"
    fetch(f"{server}/data.bin", dest, md5=hashlib.md5(PAYLOAD).hexdigest())
    fetch(f"{server}/data.bin", dest, sha256=sha(PAYLOAD))
    assert _RangeHandler.ranges == [None]  # the second call found the verified file


def test_fetch_http_errors_are_clear(server, tmp_path):
    with pytest.raises(FmauditInputError, match="HTTP 404"):
        fetch(f"{server}/missing.bin", tmp_path / "x")
    with pytest.raises(FmauditInputError, match="unsupported URL scheme"):
        fetch("ftp://example.invalid/x", tmp_path / "y")


def test_fetch_file_url_resume(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(PAYLOAD)
    dest = tmp_path / "out" / "copy.bin"
    dest.parent.mkdir()
    (dest.parent / "copy.bin.part").write_bytes(PAYLOAD[:1234])
    fetch(src.as_uri(), dest, sha256=sha(PAYLOAD), expected_size=len(PAYLOAD))
    assert dest.read_bytes() == PAYLOAD
    with pytest.raises(FmauditInputError, match="no such file"):
        fetch((tmp_path / "nope").as_uri(), tmp_path / "n")


def test_verify_file_existing_dest_mismatch(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"abc")
    verify_file(p, sha256=sha(b"abc"), md5=hashlib.md5(b"abc").hexdigest(), expected_size=3)
    with pytest.raises(FmauditInputError, match="sha256"):
        fetch(p.as_uri(), p, sha256=sha(b"abd"))


# ---------------------------------------------------------------- unpack

def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _tar(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tf.addfile(info)
    return path


def test_unpack_zip_and_tar_and_marker(tmp_path):
    z = _zip(tmp_path / "a.zip", {"set/ADI/x.tif": b"1", "set/BACK/y.tif": b"2", "__MACOSX/set/._x": b"junk"})
    out = unpack(z, tmp_path / "root")
    assert (out / "set" / "ADI" / "x.tif").read_bytes() == b"1"
    assert not (out / "__MACOSX").exists()
    assert unpack(z, tmp_path / "root") == out  # marker: second call is a no-op
    t = _tar(tmp_path / "b.tar.gz", {"other/z.png": b"3"}, links={"other/ok_link": "z.png"})
    unpack(t, tmp_path / "root")
    assert (out / "other" / "z.png").read_bytes() == b"3"
    assert not list(out.glob(".unpack-*"))


@pytest.mark.parametrize("name", ["../evil.txt", "/abs/evil.txt", "a/../../evil.txt"])
def test_unpack_refuses_path_traversal_zip(tmp_path, name):
    z = _zip(tmp_path / "bad.zip", {"fine.txt": b"ok", name: b"evil"})
    dest = tmp_path / "dest" / "inner"
    with pytest.raises(FmauditInputError, match="refusing to unpack"):
        unpack(z, dest)
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "dest" / "evil.txt").exists()
    assert not (dest / "fine.txt").exists()  # nothing half-unpacked


@pytest.mark.parametrize("members,links", [
    ({"../evil.txt": b"x"}, None),
    ({"ok.txt": b"x"}, {"link": "../../etc/passwd"}),
    ({"ok.txt": b"x"}, {"link": "/etc/passwd"}),
])
def test_unpack_refuses_path_traversal_tar(tmp_path, members, links):
    t = _tar(tmp_path / "bad.tar.gz", members, links)
    with pytest.raises(FmauditInputError, match="refusing to unpack"):
        unpack(t, tmp_path / "dest")
    assert not (tmp_path / "evil.txt").exists()
    assert not (tmp_path / "dest" / "ok.txt").exists()


def test_unpack_clash_and_bad_archives(tmp_path):
    z = _zip(tmp_path / "a.zip", {"set/x": b"1"})
    (tmp_path / "root" / "set").mkdir(parents=True)
    with pytest.raises(FmauditInputError, match="already exists"):
        unpack(z, tmp_path / "root")
    bad = tmp_path / "broken.zip"
    bad.write_bytes(b"not a zip")
    with pytest.raises(FmauditInputError, match="not a valid zip"):
        unpack(bad, tmp_path / "r2")
    with pytest.raises(FmauditInputError, match="unknown archive type"):
        unpack(_zip(tmp_path / "a.rar", {}), tmp_path / "r3")


def test_gunzip_and_gz_unpack(tmp_path):
    gz = tmp_path / "x_test.h5.gz"
    gz.write_bytes(gzip.compress(b"hdf5 bytes"))
    assert gunzip(gz).read_bytes() == b"hdf5 bytes"
    assert (tmp_path / "x_test.h5").exists()
    gz2 = tmp_path / "y.csv.gz"
    gz2.write_bytes(gzip.compress(b"a,b\n"))
    unpack(gz2, tmp_path / "u")
    assert (tmp_path / "u" / "y.csv").read_bytes() == b"a,b\n"


def test_download_dataset_from_registry_entry(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    z = _zip(mirror / "set.zip", {"MHIST/images/a.png": b"png"})
    csv = mirror / "annotations.csv"
    csv.write_bytes(b"Image Name,Majority Vote Label,Partition\n")
    entry = {"files": [
        {"url": z.as_uri(), "sha256": sha(z.read_bytes()), "unpack": True},
        {"url": csv.as_uri(), "name": "annotations.csv", "into": "MHIST",
         "md5": hashlib.md5(csv.read_bytes()).hexdigest()},
    ]}
    root = tmp_path / "data"
    download_dataset("mhist", entry, root)
    assert (root / "MHIST" / "images" / "a.png").read_bytes() == b"png"
    assert (root / "MHIST" / "annotations.csv").exists()
    assert (root / "downloads" / "mhist" / "set.zip").exists()
    with pytest.raises(FmauditInputError, match="cannot be downloaded automatically. Register"):
        download_dataset("bracs", {"how_to_get": "Register at the portal."}, root)


# ---------------------------------------------------------------- downloads without a published checksum

def test_unchecksummed_archive_gets_its_sha256_printed_once_and_recorded(tmp_path, caplog):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    z = _zip(mirror / "set.zip", {"SET/a.png": b"png"})
    entry = {"files": [{"url": z.as_uri(), "sha256": None, "md5": None, "unpack": True}]}
    root = tmp_path / "data"
    with caplog.at_level("INFO", logger="fmaudit.datasets.download"):
        download_dataset("set", entry, root)
    archive = root / "downloads" / "set" / "set.zip"
    expected = sha(z.read_bytes())
    sidecar = archive.with_name("set.zip.sha256")
    assert sidecar.read_text() == f"{expected}  set.zip\n"  # sha256sum format: `sha256sum -c` reads it
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "no published checksum" in warnings[0].getMessage() and expected in warnings[0].getMessage()
    assert downloaded_checksums("set", entry, root) == [
        {"url": z.as_uri(), "path": str(archive), "sha256": expected, "sha256_source": "recorded"}]

    caplog.clear()
    with caplog.at_level("INFO", logger="fmaudit.datasets.download"):
        download_dataset("set", entry, root)  # the second run checks against the record, silently
    assert not [r for r in caplog.records if r.levelname == "WARNING"]

    archive.write_bytes(archive.read_bytes() + b"corrupt")
    with pytest.raises(FmauditInputError, match=r"does not match the expected .*recorded in .*set\.zip\.sha256"):
        download_dataset("set", entry, root)


def test_redownload_of_an_unchecksummed_file_is_checked_against_the_record(tmp_path):
    src = tmp_path / "annotations.csv"
    src.write_bytes(b"a,b\n1,2\n")
    dest = tmp_path / "data" / "annotations.csv"
    fetch(src.as_uri(), dest)
    recorded = sha256_sidecar(dest).read_text().split()[0]
    assert recorded == sha(src.read_bytes())
    dest.unlink()  # e.g. removed to save space; the record stays
    src.write_bytes(b"a,b\n1,3\n")  # and the source changed meanwhile
    with pytest.raises(FmauditInputError,
                       match=r"sha256 .* does not match the expected .*recorded in .* at an earlier"):
        fetch(src.as_uri(), dest)
    assert not dest.exists() and not dest.with_name("annotations.csv.part").exists()


def test_md5_only_download_records_sha256_without_a_warning(tmp_path, caplog):
    src = tmp_path / "x.npz"
    src.write_bytes(b"npz bytes")
    with caplog.at_level("INFO", logger="fmaudit.datasets.download"):
        dest = fetch(src.as_uri(), tmp_path / "data" / "x.npz", md5=hashlib.md5(b"npz bytes").hexdigest())
    assert sha256_sidecar(dest).read_text().startswith(sha(b"npz bytes"))
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    sha256_sidecar(dest).write_text("not a hash\n")
    with pytest.raises(FmauditInputError, match=r"x\.npz\.sha256: not a sha256 record"):
        fetch(src.as_uri(), dest)


def test_published_sha256_writes_no_sidecar(tmp_path):
    src = tmp_path / "y.bin"
    src.write_bytes(b"y")
    dest = fetch(src.as_uri(), tmp_path / "data" / "y.bin", sha256=sha(b"y"))
    assert not sha256_sidecar(dest).exists()
    entry = {"files": [{"url": src.as_uri(), "name": "y.bin", "sha256": sha(b"y")}]}
    assert downloaded_checksums("ds", entry, tmp_path / "data")[0]["sha256_source"] == "published"
