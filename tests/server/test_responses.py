"""The Responses API on the real default model (Qwen2.5-Coder-0.5B-Instruct) through the
official openai SDK: plain and streamed responses, stored and retrieved, chained with
``previous_response_id`` so that only the new input is decoded, forked from an older response,
function-call round trips, and the items and fields we do not support refused by name."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.server.test_app import Running, _serve

MODEL = "qwen2.5-coder-0.5b"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
BRIEF = "Answer in a few words."


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    yield from _serve(tmp_path_factory.mktemp("responses"), model=MODEL, default_max_tokens=32)


def create(srv: Running, **kw: Any) -> Any:
    kw.setdefault("max_output_tokens", 16)
    kw.setdefault("instructions", BRIEF)
    return srv.client().responses.create(model=srv.state.model_id, temperature=0, **kw)


def extra(r: Any) -> dict[str, Any]:
    return r.usage.model_extra["continuum"]  # type: ignore[no-any-return]


def test_a_response_is_stored_retrieved_and_deleted(qwen: Running) -> None:
    r = create(qwen, input="Say hello.")
    assert r.id.startswith("resp_") and r.object == "response" and r.output_text
    assert r.status in ("completed", "incomplete")
    assert r.usage.input_tokens > 0 and r.usage.input_tokens_details.cached_tokens >= 0
    c = qwen.client()
    got = c.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)


def test_previous_response_id_decodes_only_the_new_input(qwen: Running) -> None:
    first = create(qwen, input="My name is Ada. Reply with OK.")
    second = create(qwen, input="What is my name?", previous_response_id=first.id)
    u1, u2 = first.usage, second.usage
    # the first prompt and its reply as generated are reused; the new message is decoded
    assert u2.input_tokens_details.cached_tokens >= u1.input_tokens + u1.output_tokens - 1
    assert (
        extra(second)["prompt_tokens_evaluated"]
        == u2.input_tokens - u2.input_tokens_details.cached_tokens
    )
    assert extra(second)["prompt_tokens_evaluated"] < 30
    # a fork from the first response: its chain is still held, not prefilled again
    fork = create(qwen, input="What is my name? Answer in capitals.", previous_response_id=first.id)
    assert fork.usage.input_tokens_details.cached_tokens >= u1.input_tokens
    assert second.previous_response_id == first.id


def test_an_unknown_previous_response_is_a_404_never_ignored(qwen: Running) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        create(qwen, input="Hi", previous_response_id="resp_nope")
    assert e.value.code == "previous_response_not_found"


def test_not_stored_cannot_be_continued(qwen: Running) -> None:
    r = create(qwen, input="Hi", store=False)
    with pytest.raises(openai.NotFoundError):
        create(qwen, input="Again", previous_response_id=r.id)


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_a_function_call_round_trip(qwen: Running) -> None:
    r = create(
        qwen,
        input="Weather in Lisbon?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=40,
    )
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert call.id.startswith("fc_") and '"city"' in call.arguments
    out = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    after = create(qwen, input=[out], previous_response_id=r.id, tools=[WEATHER])
    assert after.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens
    # the same loop stateless, every item re-sent: a function_call item and its output
    items = [
        {"role": "user", "content": "Weather in Lisbon?"},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        out,
    ]
    stateless = create(qwen, input=items, tools=[WEATHER], tool_choice="none")
    assert stateless.output_text is not None and stateless.usage.input_tokens > 0


def test_streamed_events_accumulate_to_the_stored_response(qwen: Running) -> None:
    c = qwen.client()
    kinds, text = [], ""
    numbers = []
    with c.responses.stream(
        model=qwen.state.model_id,
        input="Count to three.",
        instructions=BRIEF,
        max_output_tokens=12,
        temperature=0,
    ) as s:
        for ev in s:
            kinds.append(ev.type)
            numbers.append(ev.sequence_number)
            if ev.type == "response.output_text.delta":
                text += ev.delta
        final = s.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.done" in kinds and numbers == list(range(len(numbers)))
    assert final.output_text == text and c.responses.retrieve(final.id).output_text == text


def test_a_streamed_function_call(qwen: Running) -> None:
    c = qwen.client()
    with c.responses.stream(
        model=qwen.state.model_id,
        input="Weather in Oslo?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=32,
        temperature=0,
    ) as s:
        done = [ev for ev in s if ev.type == "response.function_call_arguments.done"]
        final = s.get_final_response()
    (call,) = [o for o in final.output if o.type == "function_call"]
    assert len(done) == 1 and done[0].arguments == call.arguments


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": [{"type": "reasoning", "summary": []}]}, "messages is empty"),
        ({"input": [{"type": "web_search_call", "action": {}}]}, "'web_search_call' are not"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "'input_image'"),
        ({"input": "hi", "tools": [{"type": "web_searcher"}]}, "tools of type 'web_searcher'"),
        ({"input": "hi", "truncation": "sometimes"}, "truncation must be 'auto'"),
        ({"input": "hi", "background": True}, "background responses"),
        ({"input": "hi", "top_logprobs": 3}, "top_logprobs=3 is not implemented"),
        ({"input": [{"role": "robot", "content": "x"}]}, "role must be one of"),
        ({"input": []}, "non-empty list"),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "output must be a string"),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "4"}]},
            "no tool call found for the function_call_output with call_id 'call_x'",
        ),
        (
            {
                "input": [
                    {"type": "function_call_output", "call_id": "call_y", "output": "4"},
                    {"type": "function_call", "call_id": "call_y", "name": "f", "arguments": "{}"},
                ]
            },
            "call_id 'call_y'",  # an output before its call answers nothing yet
        ),
        (
            {"input": [{"type": "compaction", "encrypted_content": "bm90IG91cnM="}]},
            "was not written by this server's /v1/responses/compact",
        ),
    ],
)
def test_unsupported_items_and_fields_are_a_400_naming_them(
    qwen: Running, body: dict[str, Any], message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        qwen.client().post(
            "/responses", body={"model": qwen.state.model_id, **body}, cast_to=object
        )
    assert message in str(e.value)


def test_a_full_resend_client_with_a_cache_key_decodes_only_what_is_new(qwen: Running) -> None:
    """Codex's behaviour: the whole input every turn, and a prompt_cache_key."""
    items: list[dict[str, Any]] = []
    sessions = set()
    for turn, ask in enumerate(["My name is Ada.", "I live in Lisbon.", "What is my name?"]):
        items.append({"role": "user", "content": ask})
        r = create(
            qwen,
            input=list(items),
            prompt_cache_key="codex-thread-1",
            max_output_tokens=8,
            tools=[WEATHER],
            tool_choice="none",
        )
        m = extra(r)
        sessions.add(m["session"])
        assert m["resets"] == []  # the session was created with the tools: its wake is right
        if turn:
            assert m["tokens_truncated"] == 0 and m["resets"] == []
            assert m["prompt_tokens_evaluated"] < 30  # the new message and its headers
            assert r.usage.input_tokens_details.cached_tokens == m["tokens_reused"]
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": r.output_text}],
            }
        )
    assert len(sessions) == 1


TEN = [
    "My name is Ada.", "I live in Lisbon.", "I keep bees.", "My bees make honey in June.",
    "I have a cat called Pim.", "Pim is grey.", "I work on Tuesdays.", "My car is red.",
    "I was born in 1990.", "What is my name?",
]  # fmt: skip


@pytest.mark.slow
def test_ten_turns_of_full_resend_decode_what_a_delta_client_decodes(qwen: Running) -> None:
    """Codex's behaviour over ten turns (every item re-sent, a prompt_cache_key) against a
    client of the sessions API that sends only the new message: per turn, the same number of
    prompt tokens is decoded. A previous_response_id chain decodes no fewer (its stored reply is
    re-tokenised from text: its last tokens can split otherwise than they were generated)."""
    items: list[dict[str, Any]] = []
    prev, key = None, f"ten-{uuid.uuid4().hex}"
    other = "Answer in a few short words."  # other instructions: not the memo of the other's turn
    with qwen.http() as h:
        sid = h.post("/v1/sessions", json={"system": other}).json()["id"]
        resend, delta, chain = [], [], []
        for ask in TEN:
            said = {"role": "user", "content": ask}
            r = create(qwen, input=[*items, said], prompt_cache_key=key, max_output_tokens=8)
            body = {"messages": [said], "max_tokens": 8, "temperature": 0}
            d = h.post(f"/v1/sessions/{sid}/messages", json=body).json()
            c = create(
                qwen,
                input=[said],
                previous_response_id=prev,
                max_output_tokens=8,
                instructions="Answer in very few words.",
            )
            resend.append(extra(r)["prompt_tokens_evaluated"])
            delta.append(d["usage"]["continuum"]["prompt_tokens_evaluated"])
            chain.append(extra(c)["prompt_tokens_evaluated"])
            reply = [{"type": "output_text", "text": r.output_text}]
            items += [said, {"type": "message", "role": "assistant", "content": reply}]
            prev = c.id
    assert resend[1:] == delta[1:], (resend, delta)
    assert max(resend[1:]) < 30  # the new message and its headers, every turn
    assert all(a <= b for a, b in zip(resend[1:], chain[1:], strict=True)), (resend, chain)


def test_an_x_session_id_header_puts_a_chat_client_on_a_session(qwen: Running) -> None:
    c = qwen.client()
    chat: list[dict[str, Any]] = [{"role": "user", "content": "Say OK."}]
    headers = {"X-Session-ID": "agent-7"}
    first = c.chat.completions.create(
        model=qwen.state.model_id,
        messages=chat,
        max_tokens=4,
        temperature=0,  # type: ignore[arg-type]
        extra_headers=headers,
    )
    chat += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "Again."},
    ]
    second = c.chat.completions.create(
        model=qwen.state.model_id,
        messages=chat,
        max_tokens=4,
        temperature=0,  # type: ignore[arg-type]
        extra_headers=headers,
    )
    m1, m2 = (r.usage.model_extra["continuum"] for r in (first, second))  # type: ignore[union-attr]
    assert m1["session"] == m2["session"] and m2["tokens_truncated"] == 0
    assert m2["prompt_tokens_evaluated"] < 20
    other = c.chat.completions.create(
        model=qwen.state.model_id,
        messages=chat,
        max_tokens=4,
        temperature=0,  # type: ignore[arg-type]
        extra_headers={**headers, "X-Continuum-Tenant": "someone-else"},
    )
    assert other.usage.model_extra["continuum"]["session"] != m1["session"]  # type: ignore[union-attr]


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_truncation_auto_drops_the_oldest_turns_and_disabled_refuses(tmp_path: Any) -> None:
    """On the fast model with a small context: a conversation that cannot fit."""
    turns: list[dict[str, Any]] = []
    for i in range(12):
        turns.append({"role": "user", "content": f"Fact {i}: " + "the sky is blue. " * 12})
        turns.append({"role": "assistant", "content": f"Noted {i}."})
    turns.append({"role": "user", "content": "Which fact came last?"})
    for srv in _serve(tmp_path, n_ctx=512):
        c = srv.client()
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(model=srv.state.model_id, input=turns, max_output_tokens=4)  # type: ignore[arg-type]
        assert e.value.code == "context_length_exceeded"
        r = c.responses.create(
            model=srv.state.model_id,
            input=turns,
            max_output_tokens=4,
            truncation="auto",  # type: ignore[arg-type]
            instructions="Be brief.",
        )
        assert 200 < r.usage.input_tokens < 512 - 4 and r.truncation == "auto"
        # a full-resend client on a hinted session: the same answers
        hinted = {
            "model": srv.state.model_id,
            "input": turns,
            "max_output_tokens": 4,
            "prompt_cache_key": "long-thread",
        }
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(**hinted)
        assert e.value.code == "context_length_exceeded"
        r = c.responses.create(**hinted, truncation="auto")
        m = r.usage.model_extra["continuum"]
        assert m["session"].startswith("hint-") and m["context_used"] < 512
        assert [x["reason"] for x in m["resets"]] == ["high_water"]


@pytest.mark.slow  # over 3 s alone: the full run's (see pyproject's markers)
def test_a_fork_from_a_response_whose_slot_was_evicted_restores_its_snapshot(
    qwen: Running,
) -> None:
    first = create(qwen, input="My name is Ada and I keep bees. Reply with OK.")
    for i in range(qwen.state.config.engine.backend.llamacpp.n_slots + 1):  # every slot taken
        create(qwen, input=f"Count from {i} to {i + 3}.", instructions=f"Task {i}.")
    fork = create(qwen, input="What do I keep?", previous_response_id=first.id)
    m = extra(fork)
    u1 = first.usage
    # restored from the snapshot its slot was spilled to: the chain is not prefilled again
    assert m["hit_tier"] == "layer_kv"
    assert fork.usage.input_tokens_details.cached_tokens >= u1.input_tokens + u1.output_tokens - 1
    assert m["prompt_tokens_evaluated"] < 30


def test_compact_returns_the_user_messages_and_a_note_the_next_response_reads(
    qwen: Running,
) -> None:
    c = qwen.client()
    first = create(qwen, input="My name is Ada and my dog is called Rex. Reply with OK.")
    second = create(qwen, input="I live in Porto. Reply with OK.", previous_response_id=first.id)
    compacted = c.responses.compact(
        model=qwen.state.model_id, previous_response_id=second.id, instructions=BRIEF
    )
    assert compacted.object == "response.compaction"
    *said, item = compacted.output
    assert [m.role for m in said] == ["user", "user"] and item.type == "compaction"
    assert "Porto" in said[1].content[0].text
    # the chain was held by the prefix KV tier: only the request to summarise was decoded
    u2 = second.usage
    assert compacted.usage.input_tokens_details.cached_tokens >= u2.input_tokens
    assert compacted.usage.output_tokens > 0
    note = json.loads(base64.urlsafe_b64decode(item.encrypted_content))["note"]
    assert note.strip()
    # sent back as the next input, the compaction item is read as the note
    ask = {"role": "user", "content": "What is my name?"}
    items = [o.model_dump(exclude_none=True) for o in compacted.output]
    after = create(qwen, input=[*items, ask])
    without = create(qwen, input=[*items[:-1], ask])
    assert after.output_text and after.status in ("completed", "incomplete")
    n_note = len(qwen.state.sessions().backend.tokenize(note, special=False))
    assert after.usage.input_tokens >= without.usage.input_tokens + n_note


def test_compact_with_nothing_to_compact_or_an_unknown_response_is_refused(
    qwen: Running,
) -> None:
    c = qwen.client()
    with pytest.raises(openai.BadRequestError, match="nothing to compact"):
        c.responses.compact(model=qwen.state.model_id)
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.compact(model=qwen.state.model_id, previous_response_id="resp_nope")
    assert e.value.code == "previous_response_not_found"


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_stored_responses_outlive_the_server(tmp_path: Any) -> None:
    """On the fast model: the history store keeps every stored response, so a restarted
    server retrieves and continues them; a deleted one still serves its children."""
    ids = []
    for srv in _serve(tmp_path):
        c = srv.client()
        first = c.responses.create(
            model=srv.state.model_id, input="My name is Ada.", max_output_tokens=4
        )
        second = c.responses.create(
            model=srv.state.model_id,
            input="I keep bees.",
            previous_response_id=first.id,
            max_output_tokens=4,
        )
        ids, text, used = [first.id, second.id], second.output_text, second.usage
    for srv in _serve(tmp_path):  # a new process' state, the same store
        c = srv.client()
        assert c.responses.retrieve(ids[1]).output_text == text
        c.responses.delete(ids[0])
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(ids[0])
        third = c.responses.create(
            model=srv.state.model_id,
            input="What do I keep?",
            previous_response_id=ids[1],
            max_output_tokens=4,
        )
        assert third.usage.input_tokens > used.input_tokens + used.output_tokens


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"input": 42}, 400, "invalid_request"),
        ({"input": [{"type": "reasoning"}]}, 400, "invalid_request"),
        ({"input": "hi", "instructions": 7}, 400, "invalid_request"),
        ({"input": "hi", "model": "no-such-model"}, 404, "model_not_found"),
        ({"input": "x" * (5 << 20)}, 413, "body_too_large"),
    ],
)
def test_compact_refuses_bad_input_with_a_typed_error(
    qwen: Running, body: dict[str, Any], status: int, code: str
) -> None:
    with qwen.http() as h:
        r = h.post("/v1/responses/compact", json={"model": qwen.state.model_id, **body})
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["code"] == code and err["message"], r.text
        assert h.get("/health").json()["status"] == "ok"
