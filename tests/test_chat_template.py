"""Chat templates: the model's own template, the fallback, and hostile templates."""

from __future__ import annotations

import time

import pytest

from localinfer.chat_template import ChatTemplate, validate_messages
from localinfer.errors import ChatTemplateError, InvalidRequestError

SMOL = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_renders_with_generation_prompt() -> None:
    t = ChatTemplate(SMOL)
    text = t.render([{"role": "user", "content": "hi"}])
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert "SmolLM" in text
    without = t.render([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert not without.endswith("assistant\n")


def test_real_model_template(smollm2_path) -> None:
    from localinfer.gguf_file import open_gguf

    with open_gguf(smollm2_path) as g:
        t = ChatTemplate.from_gguf(g.metadata)
    assert not t.is_fallback
    text = t.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}])
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_fallback_is_chatml() -> None:
    t = ChatTemplate.from_gguf({})
    assert t.is_fallback
    assert t.render([{"role": "user", "content": "x"}]) == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


def test_text_parts_are_joined() -> None:
    msgs = validate_messages([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert msgs[0]["content"] == "ab"


@pytest.mark.parametrize(
    "messages",
    [None, "hello", [], [123], [{}], [{"role": 123, "content": "x"}], [{"role": "user", "content": 5}],
     [{"role": "wizard", "content": "x"}], [{"role": "user", "content": [{"type": "image_url"}]}]],
)
def test_malformed_messages(messages) -> None:
    with pytest.raises(InvalidRequestError):
        ChatTemplate(SMOL).render(messages)


@pytest.mark.parametrize(
    "source",
    [
        "{{ ().__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ messages|attr('__class__') }}",
        "{{ self.__init__.__globals__ }}",
        "{{ messages.append(1) }}",
    ],
)
def test_sandbox_escapes_are_refused(source: str) -> None:
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    "source",
    [
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{{ 'a' * 1000000000 }}",
        "{% for i in range(100000) %}{{ 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa' }}{% endfor %}",
        "{{ 2 ** 100000000 }}",
    ],
)
def test_runaway_templates_are_bounded(source: str) -> None:
    start = time.monotonic()
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])
    assert time.monotonic() - start < 10


def test_raise_exception_message_is_kept() -> None:
    t = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        t.render([{"role": "assistant", "content": "x"}])


def test_template_that_does_not_compile() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}")
