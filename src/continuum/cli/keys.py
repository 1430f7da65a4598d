"""``continuum keys add TENANT``: make an API key for a tenant of ``continuum serve``.

The key is printed once, on stdout; only its SHA-256 digest is written to the keys file
(``serve --api-keys FILE`` reads it), so the file does not give the key away.
"""

from __future__ import annotations

from pathlib import Path

import click

from continuum.server.auth import Credential, check_tenant, new_key, read_keys_file


@click.group("keys")
def keys() -> None:
    """API keys of the server's tenants (hashed at rest)."""


@keys.command("add")
@click.argument("tenant")
@click.option(
    "--file",
    "path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("continuum-keys.txt"),
    show_default=True,
    help="The keys file to append the key's digest to (created if missing).",
)
def add(tenant: str, path: Path) -> None:
    """Make a key for TENANT: the key on stdout, its digest appended to the keys file."""
    check_tenant(tenant)  # a bad name is refused before anything is written
    if path.exists():
        read_keys_file(path)  # refuse to append to a file serve could not read
    key = new_key()
    line = Credential.of(tenant, key).line()
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
    path.chmod(0o600)
    click.echo(key)
    click.echo(f"added tenant {tenant!r} to {path}; serve with --api-keys {path}", err=True)
