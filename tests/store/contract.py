"""What the store contract tests share: the implementations' names and a mark for a finding."""

from __future__ import annotations

import pytest

KINDS = ("sqlite", "redis")


def xfail_on(kind: str, reason: str, kinds: tuple[str, ...] = KINDS) -> pytest.MarkDecorator:
    """Run a test on every implementation (the ``impl`` fixture's params), expecting it to fail
    on ``kind`` alone: a difference between the stores, pinned with its reason."""
    mark = pytest.mark.xfail(strict=True, reason=reason)
    params = [pytest.param(k, marks=mark) if k == kind else k for k in kinds]
    return pytest.mark.parametrize("impl", params, indirect=True)
