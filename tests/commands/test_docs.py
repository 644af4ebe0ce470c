"""``fmaudit docs settings``: writes the settings page from the schema, and ``--check`` fails on a stale page."""

from __future__ import annotations

from fmaudit.cli import main
from fmaudit.settings_reference import settings_reference


def test_docs_settings_writes_the_page_and_check_fails_on_a_stale_one(tmp_path, capsys):
    page = tmp_path / "settings.md"
    assert main(["docs", "settings", "--check", "--out", str(page)]) == 1  # missing
    assert main(["docs", "settings", "--out", str(page)]) == 0
    assert page.read_text() == settings_reference()
    assert main(["docs", "settings", "--check", "--out", str(page)]) == 0
    page.write_text(page.read_text().replace("everything", "nothing", 1))
    assert main(["docs", "settings", "--check", "--out", str(page)]) == 1
    assert "stale" in capsys.readouterr().err
