"""``bench shared-prefix`` on the real model: the first session of a tenant decodes the whole
system prompt, as the cold reference does; every later one (past the lanes too: each new one
parks the oldest) copies it from a lane and decodes only its own message."""

from __future__ import annotations

import pytest

from continuum.backends.models import ModelFile
from continuum.bench.shared_prefix import run_shared_prefix, shared_prefix_table

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)


def test_later_sessions_decode_only_their_own_message(gemma: ModelFile) -> None:
    plan = {"sessions": 6, "system_tokens": 300, "max_tokens": 4, "n_ctx": 1024}
    result = run_shared_prefix("gemma3-270m", 1, 2, plan)
    cold, rows = result["cold"]["decoded"], result["rows"]
    assert result["prompt_tokens"] > 300 and cold > result["prompt_tokens"]
    assert rows[0]["decoded"] == cold  # nothing of its tenant to copy from yet
    own = cold - result["prompt_tokens"]  # the template and the message around the prompt
    assert all(r["decoded"] <= own + 8 for r in rows[1:])
    table = shared_prefix_table(result)
    assert gemma.path.name in table and "| 6 |" in table


def test_on_one_lane_later_sessions_load_the_prompt_from_a_parked_sibling(gemma: ModelFile) -> None:
    """One lane: every new session parks the one before it, so no lane ever holds the prompt
    when the next one wakes; each loads it from the parked sibling's snapshot instead."""
    plan = {"sessions": 3, "system_tokens": 300, "max_tokens": 4, "n_ctx": 1024, "lanes": 1}
    result = run_shared_prefix("gemma3-270m", 1, 2, plan)
    cold, rows = result["cold"]["decoded"], result["rows"]
    assert result["lanes"] == 1 and rows[0]["decoded"] == cold
    own = cold - result["prompt_tokens"]
    assert all(r["decoded"] <= own + 8 for r in rows[1:])
    assert "1 lane;" in shared_prefix_table(result)
