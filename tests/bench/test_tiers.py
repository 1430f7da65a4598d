"""``bench tiers`` names every answer that reuse changed: the run, the call, the tier that
served it and the first token where it parts from the answer with reuse off."""

from __future__ import annotations

from continuum.bench.tiers import mismatches


def run(tokens: list[list[int]], tiers: list[str]) -> dict[str, object]:
    return {"tokens": tokens, "tiers": tiers}


def test_every_differing_answer_is_listed_with_where_it_parts() -> None:
    stack = [
        run([[1, 2, 3], [4, 5], [6]], ["cold", "prefix_kv", "memo"]),
        run([[1, 2, 3], [4, 9, 9], [6]], ["cold", "prefix_kv", "memo"]),
    ]
    never = [
        run([[1, 2, 3], [4, 5], [6]], ["cold", "cold", "cold"]),
        run([[1, 2, 3], [4, 5, 9], [6, 7]], ["cold", "cold", "cold"]),
    ]
    assert mismatches(stack, never) == [  # type: ignore[arg-type]
        {"rep": 1, "call": 1, "tier": "prefix_kv", "first_token": 1},
        {"rep": 1, "call": 2, "tier": "memo", "first_token": 1},
    ]
    assert mismatches(stack[:1], never[:1]) == []  # type: ignore[arg-type]
