"""Write ``history-v1.db``: a history store as the release before schema migrations wrote it.

The file is committed; this script documents how it was made and can remake it. It runs the
``HistoryStore`` of commit ``56530e5`` (schema version 1, before the migration framework), read
from git into a throwaway package, so it does not depend on the current code::

    python tests/data/make_history_v1.py tests/data/history-v1.db
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

RELEASE = "56530e5"
MODULES = ("__init__.py", "errors.py", "messages.py", "store/__init__.py", "store/sqlite.py")
DIGEST = "sha256:" + "ab" * 32
IDENTITY = "id:"  # a stand-in message identity: the store keeps it verbatim


def _checkout(into: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    for name in MODULES:
        target = into / "continuum" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if name == "__init__.py":  # the real one imports every optional dependency
            target.write_text("")
            continue
        src = subprocess.run(
            ["git", "show", f"{RELEASE}:src/continuum/{name}"],
            cwd=repo,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        target.write_text(src)


def main(out: Path) -> None:
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        _checkout(Path(tmp))
        sys.path.insert(0, tmp)
        sqlite = importlib.import_module("continuum.store.sqlite")
        with sqlite.HistoryStore(out) as store:
            sid = store.create_session(
                model_digest=DIGEST,
                chat_format="gemma",
                system="Be brief.",
                continuity=None,
                config={"n_ctx": 2048, "high_water": 1843, "tenant": "acme"},
                session_id="s-acme",
            )
            store.create_session(
                model_digest=DIGEST,
                chat_format="gemma",
                system=None,
                continuity=None,
                config={"n_ctx": 2048},
                session_id="s-none",
            )

            def msg(role: str, text: str, tokens: tuple[int, ...] | None = None) -> object:
                m = {"role": role, "content": text}
                gen = DIGEST if tokens is not None else None
                return sqlite.StoredMessage(m, IDENTITY + text, tokens, gen)

            for keep, (q, a, toks) in enumerate([("u1", "a1", (5, 6, 7)), ("u2", "a2", (8, 9))]):
                store.commit_turn(
                    sid,
                    keep=2 * keep,
                    new=[msg("user", q), msg("assistant", a, toks)],
                    finish_reason="stop",
                    metrics={"prompt_tokens_evaluated": 10 + keep, "resets": []},
                    system="Be brief.",
                )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
