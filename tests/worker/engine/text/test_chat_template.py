"""Chat template tests: the model's own template against llama.cpp's renderings, ChatML, sandbox and caps."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from worker.engine.errors import TemplateError
from worker.engine.text.chat_template import CHATML_TEMPLATE, ChatTemplate, flatten_message_content

USER_HI = [{"role": "user", "content": "hi"}]


def render(source: str, messages: list[dict[str, Any]] | None = None, **caps: Any) -> str:
    """Render a one-off template over a one-message conversation."""
    return ChatTemplate(source, **caps).render(messages if messages is not None else USER_HI)


# ---------------------------------------------------------------- the real SmolLM2 template


@pytest.fixture(scope="module")
def smollm2_template(smollm2_gguf_path: Path) -> ChatTemplate:
    """SmolLM2's own chat template, built from its GGUF metadata."""
    from worker.engine.formats.gguf_file import read_metadata
    from worker.engine.text.gguf_tokenizer import tokenizer_from_gguf

    metadata = read_metadata(smollm2_gguf_path)
    return ChatTemplate.from_source(metadata.get("tokenizer.chat_template"), tokenizer_from_gguf(metadata))


@pytest.mark.slow
def test_smollm2_renderings_match_fixture(
    smollm2_template: ChatTemplate, smollm2_reference: dict[str, Any]
) -> None:
    """The three reference conversations render byte for byte as the reference says."""
    cases = smollm2_reference["chat_template"]
    assert len(cases) == 3
    for case in cases:
        rendered = smollm2_template.render(
            case["messages"], add_generation_prompt=case["add_generation_prompt"]
        )
        assert rendered == case["rendered"]


@pytest.mark.slow
def test_smollm2_template_metadata(smollm2_template: ChatTemplate) -> None:
    """The template is the model's own, with its bos/eos token texts."""
    assert not smollm2_template.is_fallback
    assert (smollm2_template.bos_token, smollm2_template.eos_token) == ("<|im_start|>", "<|im_end|>")


# ---------------------------------------------------------------- ChatML fallback and message handling


@pytest.mark.parametrize("source", [None, "", "  \n"])
def test_chatml_fallback(source: str | None) -> None:
    """No template means ChatML, with the assistant header as generation prompt."""
    template = ChatTemplate(source)
    assert template.is_fallback and template.source == CHATML_TEMPLATE
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert template.render(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert template.render(messages, add_generation_prompt=False).endswith("Hi<|im_end|>\n")


def test_content_parts_are_flattened() -> None:
    """OpenAI text parts become one string; other part types are refused."""
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    assert flatten_message_content(parts) == "one\ntwo"
    assert flatten_message_content("plain") == "plain"
    rendered = ChatTemplate(None).render([{"role": "user", "content": parts}])
    assert "<|im_start|>user\none\ntwo<|im_end|>" in rendered
    with pytest.raises(TemplateError, match="image_url"):
        ChatTemplate(None).render([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])


def test_messages_need_a_role() -> None:
    """A message without a string role is refused."""
    with pytest.raises(TemplateError, match="role"):
        ChatTemplate(None).render([{"content": "x"}])


def test_variables_tools_and_extra() -> None:
    """bos/eos tokens, tools and extra keyword arguments reach the template."""
    source = "{{ bos_token }}{% if tools %}{{ tools|tojson }}{% endif %}{{ flavour }}{{ eos_token }}"
    template = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    tools = [{"type": "function", "function": {"name": "f<é>"}}]
    assert (
        template.render(USER_HI, tools=tools, flavour="!")
        == '<s>[{"type": "function", "function": {"name": "f<é>"}}]!</s>'
    )
    assert template.render(USER_HI) == "<s></s>"


def test_hf_environment_features() -> None:
    """trim_blocks/lstrip_blocks, loop controls, namespace, strftime_now and {% generation %} work."""
    source = (
        "{% set ns = namespace(n=0) %}\n"
        "  {% for m in messages %}\n"
        "{% if loop.index > 2 %}{% break %}{% endif %}"
        "{% set ns.n = ns.n + 1 %}{% generation %}{{ m.content ~ '|' }}{% endgeneration %}"
        "{% endfor %}\n"
        "{{ ns.n }} {{ strftime_now('%Y')|length }}"
    )
    messages = [{"role": "user", "content": c} for c in "abc"]
    assert render(source, messages) == "a|b|2 4"


def test_llama_cpps_globals_are_there() -> None:
    """What llama.cpp's jinja gives every template: tojson as a function too, dict, range, strftime_now (local)."""
    source = "{{ tojson({'a': [1, 'é']}) }} {{ dict(x=1).x }} {{ range(3)|list }} {{ strftime_now('%Y-%m-%d')|length }}"
    assert render(source) == '{"a": [1, "é"]} 1 [0, 1, 2] 10'


def test_the_templates_clock_can_be_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    """LLMFLEET_TEMPLATE_NOW is the time strftime_now gives (a reply that does not change with the day); unset, the
    host's clock; malformed, the template fails to load, naming the variable."""
    source = "{{ strftime_now('%d %b %Y %H:%M') }}"
    monkeypatch.setenv("LLMFLEET_TEMPLATE_NOW", "2026-11-29T12:30:00")
    assert render(source) == "29 Nov 2026 12:30"
    monkeypatch.delenv("LLMFLEET_TEMPLATE_NOW")
    assert render("{{ strftime_now('%Y') }}") == time.strftime("%Y")
    monkeypatch.setenv("LLMFLEET_TEMPLATE_NOW", "yesterday")
    with pytest.raises(TemplateError, match="LLMFLEET_TEMPLATE_NOW='yesterday' is not an ISO 8601 time"):
        ChatTemplate(source)


def test_raise_exception_message_is_kept() -> None:
    """raise_exception() becomes a TemplateError carrying the template's own message."""
    with pytest.raises(TemplateError, match="^Conversation roles must alternate$"):
        render("{{ raise_exception('Conversation roles must alternate') }}")


# ---------------------------------------------------------------- failures are TemplateError, never raw jinja


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{% if %}", "syntax error at line 1"),
        ("{% for x in %}", "syntax error"),
        ("{{ nothing.here }}", "UndefinedError"),
        ("{% include 'other' %}", "failed"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursed too deeply"),
        ("{{ range(10**9) }}", "Range too big"),
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ],
)
def test_failures_become_template_errors(source: str, message: str) -> None:
    """Syntax errors, undefined values and runtime errors all raise TemplateError."""
    with pytest.raises(TemplateError, match=message) as info:
        render(source)
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__ }}",
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ joiner.__init__.__globals__['os'] }}",
        "{{ namespace.__init__.__globals__ }}",
        "{{ messages.append(1) }}",
        "{{ messages[0].update({'role': 'x'}) }}",
        "{{ '{0.__class__}'.format('') }}",
        "{{ raise_exception.__globals__ }}",
    ],
)
def test_sandbox_refuses_escapes(source: str) -> None:
    """Dunder access, globals of callables and mutation are refused with TemplateError."""
    with pytest.raises(TemplateError, match="unsafe|SecurityError"):
        render(source)


def test_lipsum_is_gone() -> None:
    """lipsum (an unbounded generator of text) is not available to templates."""
    with pytest.raises(TemplateError, match="lipsum"):
        render("{{ lipsum(10**9) }}")


# ---------------------------------------------------------------- time and size caps


def test_time_cap_trips_on_a_silent_nested_loop() -> None:
    """A nested loop that emits nothing still stops at the deadline."""
    source = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    started = time.monotonic()
    with pytest.raises(TemplateError, match="longer than 0.2 s"):
        render(source, max_render_seconds=0.2)
    assert time.monotonic() - started < 2.0


def test_time_cap_trips_on_a_loop_over_a_list() -> None:
    """Loops over a prebuilt list are checked too, not only range()."""
    source = "{% set r = range(100000)|list %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}"
    with pytest.raises(TemplateError, match="longer than"):
        render(source, max_render_seconds=0.2)


def test_output_size_cap_trips() -> None:
    """A template printing more than max_output_chars is stopped."""
    source = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
    with pytest.raises(TemplateError, match="longer than 10000 characters"):
        render(source, max_output_chars=10_000)


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ("{{ 'x' * 10**8 }}", "repetition"),
        ("{{ 10**8 * 'x' }}", "repetition"),
        ("{{ [0] * 10**8 }}", "repetition"),
        ("{{ 10 ** (10 ** 10) }}", "power"),
        ("{{ (10 ** 20000) * (10 ** 20000) * (10 ** 20000) }}", "product"),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
            "concat",
        ),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
            "concat",
        ),
        ("{{ '%0999999999d' % 1 }}", "format width"),
        ("{{ '%*d' % (999999999, 1) }}", "format width"),
        ("{{ '%0999999999d'|format(1) }}", "format width"),
        ("{{ '{:>999999999}'.format(1) }}", "format width"),
        ("{{ '{:{}}'.format(1, 999999999) }}", "format width"),
        ("{{ 'x'|center(999999999) }}", "center"),
        ("{{ 'x'.ljust(999999999) }}", "ljust"),
        ("{{ 'a\nb'|indent(999999999) }}", "indent"),
        ("{{ '\t'.expandtabs(999999999) }}", "expandtabs"),
        ("{{ ('x' * 100000).replace('x', 'x' * 100000) }}", "replace"),
        ("{{ ('x' * 100000)|replace('x', 'x' * 100000) }}", "replace"),
        ("{{ (['x' * 100000] * 100000)|join }}", "join"),
        ("{{ ''.join(['x' * 100000] * 100000) }}", "join"),
        ("{{ ([[0] * 100000] * 100000)|sum(start=[]) }}", "sum"),
    ],
)
def test_size_caps_refuse_before_allocating(source: str, what: str) -> None:
    """Operations that would build huge values are refused up front."""
    with pytest.raises(TemplateError, match=what):
        render(source)


def test_tojson_matches_hf_and_caps_indent() -> None:
    """tojson is plain json.dumps (no HTML escaping, non-ASCII kept); a huge indent is refused."""
    assert render("{{ {'a': '<é>'}|tojson }}") == '{"a": "<é>"}'
    assert render("{{ [1]|tojson(indent=2) }}") == "[\n  1\n]"
    with pytest.raises(TemplateError, match="indent"):
        render("{{ [1]|tojson(indent=999999999) }}")


def test_ordinary_operators_still_work() -> None:
    """The guarded operators give Python's results within the caps."""
    assert render(
        "{{ 'ab' * 3 }}|{{ 2 ** 10 }}|{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ '%03d' % 7 }}|{{ 'x' ~ 1 }}"
    ) == ("ababab|1024|ab|[1, 2]|007|x1")
    assert (
        render("{{ '{:>4}'.format('a') }}|{{ 'ab'.replace('a', 'c') }}|{{ ['a', 'b']|join('-') }}")
        == "   a|cb|a-b"
    )
