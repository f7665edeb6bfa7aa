"""Errors raised by the engine: one root, each with a message a person can act on."""

from __future__ import annotations

from pathlib import Path


class EngineError(Exception):
    """Root of every error the engine raises on purpose."""


class ModelLoadError(EngineError):
    """A model file could not be loaded; the message names the file and the problem."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"cannot load model {self.path}: {problem}")


class TemplateError(EngineError):
    """A chat template failed to render (bad template, sandbox refusal, time or size cap)."""


class ContextLengthError(EngineError):
    """A sequence would not fit in the model's context window."""


class NoChatTemplateError(TemplateError):
    """Chat was asked of a model that has no chat template (a base model) and none was configured."""


class StepInterrupted(EngineError):
    """A forward stopped between layers because its caller asked: no output; `suspended` (when set) holds what it
    computed so far, which Model.resume carries on from (the keys and values of the layers done are in the pool)."""

    def __init__(self, message: str, suspended: object = None) -> None:  # a forward_batch.SuspendedForward
        super().__init__(message)
        self.suspended = suspended
