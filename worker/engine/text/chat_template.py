"""Chat templates: a model's Jinja template rendered in an immutable sandbox with time and size caps."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jinja2

from worker.engine.errors import TemplateError
from worker.engine.text.template_sandbox import CappedSandbox, check_time, describe_failure, render_deadline

if TYPE_CHECKING:
    from worker.engine.text.tokenizer import Tokenizer

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# the variables a template gets from the server; a request's chat_template_kwargs never replace them
RESERVED_TEMPLATE_VARIABLES = frozenset(("messages", "tools", "add_generation_prompt", "bos_token", "eos_token"))


def flatten_message_content(content: Any) -> Any:
    """OpenAI content parts -> one string (text parts joined by newlines); other content unchanged."""
    if not isinstance(content, list):
        return content
    texts: list[str] = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and part.get("type") == "text":
            texts.append(str(part.get("text") or ""))
        else:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise TemplateError(f"message content part of type {kind!r} is not supported (only 'text')")
    return "\n".join(texts)


class ChatTemplate:
    """A chat template compiled once and rendered many times under caps."""

    def __init__(
        self,
        source: str | None,
        *,
        bos_token: str = "",
        eos_token: str = "",
        max_render_seconds: float = 1.0,
        max_output_chars: int = 1_000_000,
    ) -> None:
        self.is_fallback = not (source and source.strip())
        self.source = CHATML_TEMPLATE if self.is_fallback else str(source)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.max_render_seconds = max_render_seconds
        self.max_output_chars = max_output_chars
        self._environment = CappedSandbox(max_output_chars)
        try:
            self._template = self._environment.compile_hardened(self.source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(
                f"chat template has a syntax error at line {exc.lineno}: {exc.message}"
            ) from None
        except Exception as exc:
            raise TemplateError(f"chat template cannot be compiled: {describe_failure(exc)}") from None

    @classmethod
    def from_source(cls, source: str | None, tokenizer: Tokenizer, **caps: Any) -> ChatTemplate:
        """A template from jinja2 source (None: ChatML), with the tokenizer's bos/eos texts."""
        bos_id, eos_id = tokenizer.bos_token_id, tokenizer.eos_token_id
        return cls(
            source,
            bos_token=tokenizer.token_text(bos_id) if bos_id is not None else "",
            eos_token=tokenizer.token_text(eos_id) if eos_id is not None else "",
            **caps,
        )

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """Render a conversation to prompt text; every failure is a TemplateError."""
        variables: dict[str, Any] = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **extra,
            "messages": [self._prepare(message) for message in messages],
            "add_generation_prompt": add_generation_prompt,
            "tools": tools,
        }
        with render_deadline(self.max_render_seconds):
            return self._render_checked(variables)

    def _render_checked(self, variables: dict[str, Any]) -> str:
        """Render under the caller's deadline, every failure turned into a TemplateError."""
        chunks = self._template.generate(variables)
        try:
            return self._collect(chunks)
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template failed: {describe_failure(exc)}") from None
        except RecursionError:
            raise TemplateError("chat template recursed too deeply") from None
        except MemoryError:
            raise TemplateError("chat template ran out of memory") from None
        except Exception as exc:
            raise TemplateError(f"chat template failed to render: {describe_failure(exc)}") from None
        finally:
            chunks.close()

    def _collect(self, chunks: Iterator[str]) -> str:
        """Join rendered chunks, checking time and size after each."""
        pieces: list[str] = []
        total = 0
        for chunk in chunks:
            total += len(chunk)
            if total > self.max_output_chars:
                raise TemplateError(f"chat template output is longer than {self.max_output_chars} characters")
            check_time()
            pieces.append(chunk)
        return "".join(pieces)

    @staticmethod
    def _prepare(message: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of one message with list content flattened to text."""
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise TemplateError("each message must be an object with a string 'role'")
        prepared = dict(message)
        if "content" in prepared:
            prepared["content"] = flatten_message_content(prepared["content"])
        return prepared
