"""Chat formats: exact rendering of the built-ins, per-message segments, and clear errors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from continuum.backends.chat_format import AssistantSplit, ChatFormat
from continuum.backends.models import resolve_model
from continuum.errors import ChatTemplateError, InvalidMessage

SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Hi?"}
ASSISTANT = {"role": "assistant", "content": "Hello."}
CONVERSATION = [SYSTEM, USER, ASSISTANT]

# (format, bos, rendered conversation without generation prompt, generation prompt)
EXPECTED = {
    "gemma": (
        "<bos>",
        "<bos><start_of_turn>user\nBe brief.\n\nHi?<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n",
        "<start_of_turn>model\n",
    ),
    "chatml": (
        "",
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi?<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n",
        "<|im_start|>assistant\n",
    ),
    "llama3": (
        "<|begin_of_text|>",
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
}

SMOLLM_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_renders_exact_text(name: str) -> None:
    bos, rendered, gen_prompt = EXPECTED[name]
    fmt = ChatFormat.builtin(name, bos_token=bos)
    assert fmt.name == name
    assert fmt.render(CONVERSATION, add_generation_prompt=False) == rendered
    assert fmt.render(CONVERSATION, add_generation_prompt=True) == rendered + gen_prompt
    assert fmt.generation_prompt(CONVERSATION) == gen_prompt


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_segments_concatenate_to_render(name: str) -> None:
    bos, rendered, _ = EXPECTED[name]
    fmt = ChatFormat.builtin(name, bos_token=bos)
    conversation = [*CONVERSATION, {"role": "user", "content": "And?"}]
    segments = fmt.segments(conversation)
    assert len(segments) == len(conversation)
    assert "".join(segments) == fmt.render(conversation, add_generation_prompt=False)
    assert "".join(segments[:3]) == rendered
    assert segments[0].startswith(bos)  # the BOS text belongs to the first segment


def test_segments_of_no_messages_is_empty() -> None:
    assert ChatFormat.builtin("gemma", bos_token="<bos>").segments([]) == []


def test_gemma_system_opens_first_user_turn() -> None:
    fmt = ChatFormat.builtin("gemma", bos_token="<bos>")
    segments = fmt.segments([SYSTEM, USER])
    # the system segment ends before the user content, so it can be prefilled on its own
    assert segments == ["<bos><start_of_turn>user\nBe brief.\n\n", "Hi?<end_of_turn>\n"]


def test_gemma_generation_prompt_after_system_only_closes_the_turn() -> None:
    fmt = ChatFormat.builtin("gemma", bos_token="<bos>")
    assert fmt.generation_prompt([SYSTEM]) == "<end_of_turn>\n<start_of_turn>model\n"
    assert fmt.render([SYSTEM], add_generation_prompt=True) == (
        "<bos><start_of_turn>user\nBe brief.\n\n<end_of_turn>\n<start_of_turn>model\n"
    )


def test_gemma_without_system_has_plain_user_turn() -> None:
    fmt = ChatFormat.builtin("gemma", bos_token="<bos>")
    assert fmt.segments([USER, ASSISTANT]) == [
        "<bos><start_of_turn>user\nHi?<end_of_turn>\n",
        "<start_of_turn>model\nHello.<end_of_turn>\n",
    ]


def test_unknown_builtin_is_a_chat_template_error() -> None:
    with pytest.raises(ChatTemplateError, match="unknown chat format 'vicuna'"):
        ChatFormat.builtin("vicuna")


def test_template_that_does_not_compile() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatFormat("broken", "{% for message in messages %}{{ message['content'] }}")


def test_raise_exception_in_template_is_a_chat_template_error() -> None:
    fmt = ChatFormat("strict", "{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        fmt.render([USER], add_generation_prompt=False)


def test_template_failing_at_render_time_is_a_chat_template_error() -> None:
    fmt = ChatFormat("bad", "{{ messages[0]['content'].nope() }}")
    with pytest.raises(ChatTemplateError, match="failed to render"):
        fmt.render([USER], add_generation_prompt=False)


def test_non_prefix_stable_template_is_refused() -> None:
    last_only = ChatFormat("last-only", "{{ messages[-1]['content'] if messages else '' }}")
    assert last_only.segments([USER]) == ["Hi?"]  # one message: nothing to contradict
    with pytest.raises(ChatTemplateError, match="not prefix-stable at message 1"):
        last_only.segments([USER, ASSISTANT])


def test_generation_prompt_that_rewrites_history_is_refused() -> None:
    fmt = ChatFormat("rewrites", "{% if add_generation_prompt %}X{% endif %}{{ messages|length }}")
    with pytest.raises(ChatTemplateError, match="generation prompt rewrites"):
        fmt.generation_prompt([USER])


def test_split_assistant_separates_header_content_and_close() -> None:
    fmt = ChatFormat.builtin("chatml")
    segment = fmt.segments([USER, ASSISTANT])[1]
    header = fmt.generation_prompt([USER])
    split = fmt.split_assistant(segment, header, "Hello.")
    assert split == AssistantSplit("<|im_start|>assistant\n", "Hello.", "<|im_end|>\n")
    assert split is not None
    assert split.header + split.content + split.close == segment


def test_split_assistant_is_none_when_template_trims_content() -> None:
    trimming = ChatFormat(
        "trims",
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] | trim }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}",
    )
    reply = {"role": "assistant", "content": "  Hello.  "}
    segment = trimming.segments([USER, reply])[1]
    assert segment == "<assistant>Hello.</s>"
    assert trimming.split_assistant(segment, "<assistant>", "  Hello.  ") is None


def test_split_assistant_is_none_when_header_differs() -> None:
    fmt = ChatFormat.builtin("chatml")
    segment = fmt.segments([USER, ASSISTANT])[1]
    assert fmt.split_assistant(segment, "<|im_start|>model\n", "Hello.") is None


@pytest.fixture(scope="module")
def smollm_format(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChatFormat]:
    with pytest.MonkeyPatch.context() as mp:  # keep resolve_model's digest cache out of $HOME
        mp.setenv("CONTINUUM_CACHE", str(tmp_path_factory.mktemp("cache")))
        template = resolve_model("smollm2-135m").info.chat_template
    assert template is not None, "SmolLM2's GGUF should carry its own chat template"
    yield ChatFormat("gguf", template)


def test_smollm_template_is_prefix_stable(smollm_format: ChatFormat) -> None:
    conversation = [USER, ASSISTANT, {"role": "user", "content": "More?"}]
    segments = smollm_format.segments(conversation)
    assert "".join(segments) == smollm_format.render(conversation, add_generation_prompt=False)
    assert segments[1] == "<|im_start|>assistant\nHello.<|im_end|>\n"
    assert segments[2] == "<|im_start|>user\nMore?<|im_end|>\n"
    assert smollm_format.generation_prompt(conversation) == "<|im_start|>assistant\n"


def test_smollm_default_system_prompt_without_system_message(smollm_format: ChatFormat) -> None:
    first = smollm_format.segments([USER, ASSISTANT])[0]
    assert first == (
        f"<|im_start|>system\n{SMOLLM_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
    )
    with_system = smollm_format.render([SYSTEM, USER], add_generation_prompt=False)
    assert SMOLLM_DEFAULT_SYSTEM not in with_system
    assert with_system.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")


def test_an_empty_conversation_renders_as_nothing_when_the_template_cannot_render_one() -> None:
    qwen = resolve_model("qwen2.5-coder-0.5b").info.chat_template
    assert qwen is not None
    fmt = ChatFormat("gguf", qwen)  # reads messages[0]: an empty list fails inside it
    assert fmt.render([], False) == ""
    first = fmt.render([{"role": "user", "content": "hi"}], False)
    assert first.startswith("<|im_start|>system\nYou are Qwen")  # its injected system prompt
    preamble = ChatFormat("t", "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    assert ChatFormat("t", preamble.source, bos_token="<s>").render([], False) == "<s>"
    with pytest.raises(ChatTemplateError):  # a conversation it cannot render still raises
        fmt.render([{"role": "user"}], False)


# Gemma 3's own rule (its GGUF template): a system message only first, then strictly alternating
ALTERNATING = (
    "{% if messages[0]['role'] == 'system' %}{% set rest = messages[1:] %}"
    "{{ '<sys>' + messages[0]['content'] + '</sys>' }}{% else %}{% set rest = messages %}"
    "{% endif %}{% for m in rest %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
    "{% endif %}{{ '<' + m['role'] + '>' + m['content'] }}{% endfor %}"
)
SYSTEMS = [
    {"role": "system", "content": "A"},
    {"role": "system", "content": "B"},
    {"role": "user", "content": "u"},
    {"role": "system", "content": "C"},
]


def test_a_template_that_takes_system_messages_anywhere_keeps_them_where_they_stand() -> None:
    fmt = ChatFormat.builtin("chatml")
    assert fmt.system_anywhere
    assert fmt.fit_systems(SYSTEMS) == SYSTEMS
    fmt.check_systems(SYSTEMS[1:])  # no error


def test_a_template_that_refuses_later_system_messages_gets_them_folded_into_one() -> None:
    fmt = ChatFormat("alternating", ALTERNATING)
    assert not fmt.system_anywhere
    folded = fmt.fit_systems(SYSTEMS)
    assert folded == [{"role": "system", "content": "A\n\nB\n\nC"}, SYSTEMS[2]]
    assert fmt.render(folded, add_generation_prompt=False) == "<sys>A\n\nB\n\nC</sys><user>u"
    one = [{"role": "system", "content": "A"}, {"role": "user", "content": "u"}]
    assert fmt.fit_systems(one) is one
    with pytest.raises(InvalidMessage, match=r"message 1.*cannot be rendered by chat template"):
        fmt.check_systems([{"role": "user", "content": "u"}, {"role": "system", "content": "C"}])
