"""The server's configuration: values refused before anything loads, and the defaults it gives
requests that leave a field out."""

from __future__ import annotations

import pytest

from continuum.errors import InvalidRequest
from continuum.server.schemas import ChatRequest, RequestDefaults
from continuum.server.state import ServerConfig


@pytest.mark.parametrize("bad", [-1, True, 1.5, "7"])
def test_a_bad_server_seed_is_refused_naming_the_field(bad: object) -> None:
    with pytest.raises(InvalidRequest, match=r"seed must be an int >= 0"):
        ServerConfig(seed=bad)  # type: ignore[arg-type]


def test_requests_without_a_seed_get_the_servers_and_their_own_wins() -> None:
    defaults = ServerConfig(seed=7, default_max_tokens=33).request_defaults
    assert defaults == RequestDefaults(33, 7)
    bare = ChatRequest(model="m", messages=[]).params(defaults)
    assert (bare.seed, bare.max_tokens, bare.deterministic) == (7, 33, True)
    own = ChatRequest(model="m", messages=[], seed=3).params(defaults)
    assert own.seed == 3
    unseeded = ChatRequest(model="m", messages=[]).params(ServerConfig().request_defaults)
    assert unseeded.seed is None and not unseeded.deterministic
