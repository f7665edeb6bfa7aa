"""Package boundaries: shared/ pulls in no Redis client or numpy; gateway/ no numpy, tokenizers or gguf."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules_after_import(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return {name.split(".")[0] for name in out.stdout.split()}


def test_shared_imports_no_redis_and_no_numpy() -> None:
    loaded = _modules_after_import("import shared.codec, shared.errors, shared.keys, shared.messages, shared.settings")
    assert not loaded & {"redis", "numpy", "starlette", "gateway", "worker"}


def test_gateway_imports_no_numpy_tokenizers_or_gguf() -> None:
    loaded = _modules_after_import("import gateway.app, gateway.__main__")
    assert not loaded & {"numpy", "tokenizers", "gguf", "worker"}


def test_no_pickle_in_our_sources() -> None:
    for package in ("shared", "gateway"):
        for path in (ROOT / package).rglob("*.py"):
            assert "pickle" not in path.read_text(), path
