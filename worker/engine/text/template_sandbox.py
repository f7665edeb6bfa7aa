"""The jinja2 sandbox chat templates render in: immutable, with caps on loops, integers, strings and time."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import filters as jinja_filters
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.visitor import NodeTransformer

from worker.engine.errors import TemplateError

MAX_INT_BITS = 100_000  # integers a template may build with * and ** (about 30,000 digits)
MAX_JSON_INDENT = 64
CHECK_TIME_EVERY = 256  # loop iterations between two deadline checks
ITER_GUARD_NAME = "__llmfleet_loop_guard"
CONCAT_GUARD_NAME = "__llmfleet_concat"
PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
BRACE_FIELD = re.compile(r"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}")
DIGITS = re.compile(r"\d+")

_render_state = threading.local()  # .deadline, .seconds: the render running on this thread


def check_time() -> None:
    """Raise TemplateError when the render running on this thread is past its deadline."""
    deadline = getattr(_render_state, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise TemplateError(f"chat template took longer than {_render_state.seconds:g} s to render")


def _check_size(size: int, limit: int, what: str, unit: str = "characters") -> None:
    """Refuse an operation whose result would be larger than its cap."""
    if size > limit:
        raise TemplateError(f"chat template {what} would build {size} {unit} (limit {limit})")


def _loop_guard(iterable: Iterable[Any]) -> Iterator[Any]:
    """Wrap every {% for %} iterable so long loops check the render deadline."""
    for index, item in enumerate(iterable):
        if index % CHECK_TIME_EVERY == 0:
            check_time()
        yield item


class _Hardener(NodeTransformer):
    """Rewrites a parsed template: loops go through the deadline guard, `~` through the size guard."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        """Wrap the loop's iterable in the deadline guard."""
        self.generic_visit(node)
        guard = nodes.Name(ITER_GUARD_NAME, "load", lineno=node.lineno)
        node.iter = nodes.Call(guard, [node.iter], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        """Replace `a ~ b` with a call that measures before joining."""
        self.generic_visit(node)
        guard = nodes.Name(CONCAT_GUARD_NAME, "load", lineno=node.lineno)
        return nodes.Call(guard, list(node.nodes), [], None, None, lineno=node.lineno)


class _GenerationTag(Extension):
    """HF's `{% generation %}` block (it marks assistant text for training); rendered as its body."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> list[nodes.Node]:
        """Parse the block's body and return it unchanged."""
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class CappedSandbox(ImmutableSandboxedEnvironment):
    """HF transformers' chat-template sandbox plus caps on time, size and big arithmetic."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, max_output_chars: int) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationTag])
        self.max_output_chars = max_output_chars
        template_now()  # a malformed LLMFLEET_TEMPLATE_NOW fails the model's load, not each request
        self.globals.pop("lipsum", None)  # lipsum(n=10**9) would run unchecked
        self.globals.update(
            {
                "raise_exception": _raise_exception,  # llama.cpp's jinja globals (common/jinja/value.cpp) beside
                "strftime_now": _strftime_now,  # jinja's own dict, namespace and range
                "tojson": _tojson,
                ITER_GUARD_NAME: _loop_guard,
                CONCAT_GUARD_NAME: self._concat,
            }
        )
        self.filters.update(
            {
                "tojson": _tojson,
                "center": _center_filter,
                "indent": _indent_filter,
                "format": _format_filter,
                "join": _join_filter,
                "replace": _replace_filter,
                "sum": _sum_filter,
            }
        )

    def compile_hardened(self, source: str) -> jinja2.Template:
        """Parse, rewrite loops and concatenations through the guards, and compile."""
        tree = _Hardener().visit(self.parse(source))
        tree.set_environment(self)
        return self.from_string(tree)

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        """Refuse unsafe attribute access at once instead of returning a silent undefined."""
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        """Check *, **, + and % for results too large to build, then apply them."""
        check_time()
        limit = self.max_output_chars
        if operator == "**" and _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1:
            _check_size(left.bit_length() * right, MAX_INT_BITS, "power", "bits")
        elif operator == "*":
            if _is_int(left) and _is_int(right):
                _check_size(left.bit_length() + right.bit_length(), MAX_INT_BITS, "product", "bits")
            elif _is_int(right) and isinstance(left, (str, list, tuple)):
                _check_size(len(left) * right, limit, "repetition")
            elif _is_int(left) and isinstance(right, (str, list, tuple)):
                _check_size(len(right) * left, limit, "repetition")
        elif (
            operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple))
        ):
            _check_size(len(left) + len(right), limit, "concatenation")
        elif operator == "%" and isinstance(left, str):
            self.check_percent_format(left, right if isinstance(right, tuple) else (right,))
        return super().call_binop(context, operator, left, right)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Check the deadline on every call, and the size of padding/replace/join string methods."""
        check_time()
        owner = getattr(obj, "__self__", None)
        if isinstance(owner, str):
            name = getattr(obj, "__name__", "")
            if name == "join" and args:
                args = (list(args[0]), *args[1:])
                _check_size(
                    sum(len(str(x)) for x in args[0]) + len(owner) * len(args[0]),
                    self.max_output_chars,
                    "join",
                )
            else:
                self._check_str_method(owner, name, args)
        return super().call(context, obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Any:
        """Sandbox str.format as jinja does, refusing huge field widths first."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt: str = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            """Refuse widths past the cap, then format."""
            for field in BRACE_FIELD.findall(fmt):
                self._check_widths(DIGITS.findall(field))
                if field.count("{") > 1:  # a nested width such as {:{}} comes from the arguments
                    self._check_widths([a for a in (*args, *kwargs.values()) if _is_int(a)])
            return wrapped(*args, **kwargs)

        return checked

    def _check_widths(self, widths: Iterable[Any]) -> None:
        """Refuse any field width or precision above the output cap."""
        for width in widths:
            _check_size(int(width), self.max_output_chars, "format width")

    def check_percent_format(self, fmt: str, args: Sequence[Any]) -> None:
        """Refuse printf-style widths (literal or '*') above the output cap."""
        for width, precision in PERCENT_SPEC.findall(fmt):
            self._check_widths(w for w in (width, precision) if w and w != "*")
            if "*" in (width, precision):
                self._check_widths(a for a in args if _is_int(a))

    def _check_str_method(self, text: str, name: str, args: Sequence[Any]) -> None:
        """Estimate the size of padding, tab-expanding and replacing string methods."""
        limit = self.max_output_chars
        if name in ("center", "ljust", "rjust", "zfill") and args and _is_int(args[0]):
            _check_size(args[0], limit, name)
        elif name == "expandtabs":
            tab = args[0] if args and _is_int(args[0]) else 8
            _check_size(len(text) + text.count("\t") * tab, limit, name)
        elif name == "replace" and len(args) >= 2:
            self.check_replace(text, str(args[0]), str(args[1]))

    def check_replace(self, text: str, old: str, new: str) -> None:
        """Refuse a replace whose result would pass the output cap."""
        hits = len(text) + 1 if old == "" else text.count(old)
        _check_size(len(text) + hits * max(len(new) - len(old), 0), self.max_output_chars, "replace")

    def _concat(self, *parts: Any) -> str:
        """The `~` operator, measured before it allocates."""
        strings = [str(part) for part in parts]
        _check_size(sum(map(len, strings)), self.max_output_chars, "concatenation")
        return "".join(strings)


@jinja2.pass_environment
def _center_filter(env: CappedSandbox, value: Any, width: int = 80) -> str:
    """jinja's center filter with a width cap."""
    _check_size(int(width), env.max_output_chars, "center")
    return jinja_filters.do_center(value, width)


@jinja2.pass_environment
def _indent_filter(
    env: CappedSandbox, s: Any, width: int | str = 4, first: bool = False, blank: bool = False
) -> str:
    """jinja's indent filter with a size estimate."""
    pad_len = len(width) if isinstance(width, str) else int(width)
    _check_size(len(str(s)) + pad_len * (str(s).count("\n") + 1), env.max_output_chars, "indent")
    return jinja_filters.do_indent(s, width, first, blank)


@jinja2.pass_environment
def _format_filter(env: CappedSandbox, value: Any, *args: Any, **kwargs: Any) -> str:
    """jinja's printf-style format filter with width caps."""
    env.check_percent_format(str(value), args)
    return jinja_filters.do_format(value, *args, **kwargs)


@jinja2.pass_environment
def _join_filter(env: CappedSandbox, value: Iterable[Any], d: str = "", attribute: Any = None) -> str:
    """jinja's join filter, measured before it allocates."""
    if attribute is not None:
        value = map(jinja_filters.make_attrgetter(env, attribute), value)
    parts = [str(item) for item in value]
    _check_size(sum(map(len, parts)) + len(str(d)) * len(parts), env.max_output_chars, "join")
    return str(d).join(parts)


@jinja2.pass_eval_context
def _replace_filter(eval_ctx: Any, s: Any, old: Any, new: Any, count: int | None = None) -> str:
    """jinja's replace filter with a size estimate."""
    eval_ctx.environment.check_replace(str(s), str(old), str(new))
    return jinja_filters.do_replace(eval_ctx, s, old, new, count)


@jinja2.pass_environment
def _sum_filter(env: CappedSandbox, iterable: Iterable[Any], attribute: Any = None, start: Any = 0) -> Any:
    """jinja's sum filter; summing sequences is measured first."""
    items = list(iterable)
    if attribute is not None:
        items = [jinja_filters.make_attrgetter(env, attribute)(item) for item in items]
    if isinstance(start, (str, list, tuple)):
        total = len(start) + sum(len(item) for item in items if isinstance(item, (str, list, tuple)))
        _check_size(total, env.max_output_chars, "sum")
    return sum(items, start)


def _is_int(value: Any) -> bool:
    """A plain integer (bool counts, as in Python arithmetic)."""
    return isinstance(value, int)


def _raise_exception(message: str) -> None:
    """The `raise_exception` global of HF chat templates."""
    raise TemplateError(str(message))


def template_now() -> datetime:
    """The time chat templates see (`strftime_now`, such as gpt-oss's and Llama 3's date): LLMFLEET_TEMPLATE_NOW
    (ISO 8601) when set, so that a reply does not change with the day, else the host's local clock."""
    pinned = os.environ.get("LLMFLEET_TEMPLATE_NOW", "").strip()
    if not pinned:
        return datetime.now()
    try:
        return datetime.fromisoformat(pinned)
    except ValueError:
        raise TemplateError(f"LLMFLEET_TEMPLATE_NOW={pinned!r} is not an ISO 8601 time") from None


def _strftime_now(format_string: str) -> str:
    """The `strftime_now` global of HF chat templates (template_now)."""
    return template_now().strftime(format_string)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """HF's tojson filter: plain json.dumps (no HTML escaping), indent capped."""
    if indent is not None and int(indent) > MAX_JSON_INDENT:
        raise TemplateError(f"tojson indent {indent} is above {MAX_JSON_INDENT}")
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def describe_failure(exc: BaseException) -> str:
    """A short, traceback-free description of a render failure."""
    message = str(getattr(exc, "message", None) or exc)
    if len(message) > 300:
        message = message[:300] + "..."
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


@contextlib.contextmanager
def render_deadline(seconds: float) -> Iterator[None]:
    """check_time() on this thread raises once `seconds` have passed (renders nest: the outer deadline returns)."""
    previous = getattr(_render_state, "deadline", None), getattr(_render_state, "seconds", None)
    _render_state.deadline = time.monotonic() + seconds
    _render_state.seconds = seconds
    try:
        yield
    finally:
        _render_state.deadline, _render_state.seconds = previous
