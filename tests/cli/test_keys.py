"""``continuum keys add``: the key once on stdout, only its digest in the keys file, which
``serve --api-keys`` reads; bad input is one ``error:`` line and exit status 2."""

from __future__ import annotations

import stat
from pathlib import Path

from click.testing import CliRunner

from continuum.cli.main import main
from continuum.server.auth import KeyRing


def test_keys_add_prints_the_key_and_stores_only_its_digest(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    runner = CliRunner()
    first = runner.invoke(main, ["keys", "add", "alpha", "--file", str(keys)])
    second = runner.invoke(main, ["keys", "add", "beta", "--file", str(keys)])
    assert first.exit_code == 0 == second.exit_code, first.output
    key_a, key_b = first.stdout.strip(), second.stdout.strip()
    text = keys.read_text()
    assert key_a not in text and key_b not in text and text.count("sha256:") == 2
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600
    ring = KeyRing.parse([], [keys])
    assert ring.tenant_of(key_a) == "alpha" and ring.tenant_of(key_b) == "beta"
    assert "--api-keys" in first.stderr


def test_bad_input_to_keys_and_serve_is_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = tmp_path / "bad.txt"
    bad.write_text("alpha not-a-digest\n")
    for args in (
        ["keys", "add", "no/slashes", "--file", str(tmp_path / "k.txt")],
        ["keys", "add", "alpha", "--file", str(bad)],
        ["serve", "--api-key", "alpha=short"],
        ["serve", "--api-keys", str(bad)],
    ):
        r = runner.invoke(main, args)
        assert r.exit_code == 2, (args, r.output)
        assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
    assert bad.read_text() == "alpha not-a-digest\n"  # nothing appended to a bad file
