"""llama.cpp's llama-server as the parity oracle (tests and bench/twin_accuracy.py): found where
../shared/peers/build-llama-server.sh builds it (or $LLAMA_SERVER), started on a free loopback port, asked for greedy tokens with their top log-probabilities."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

BUILT = Path.home() / ".cache/llmfleet-peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server"


def llama_server_binary() -> Path | None:
    """The llama-server binary ($LLAMA_SERVER, else the peers build's), or None where neither exists."""
    given = os.environ.get("LLAMA_SERVER")
    for candidate in (Path(given) if given else None, BUILT):
        if candidate is not None and os.access(candidate, os.X_OK):
            return candidate
    return None


def llama_quantize_binary() -> Path | None:
    """llama-quantize beside the llama-server found, or None."""
    server = llama_server_binary()
    quantize = server.parent / "llama-quantize" if server else None
    return quantize if quantize is not None and os.access(quantize, os.X_OK) else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LlamaServer:
    """One llama-server process on a model file (a thread per core, one slot), stopped on exit."""

    def __init__(self, model: Path, *extra: str, log: Path | None = None) -> None:
        binary = llama_server_binary()
        assert binary is not None, "no llama-server binary"
        self.port = _free_port()
        self.argv = [str(binary), "-m", str(model), "-t", str(os.cpu_count() or 2), "-np", "1", "-c", "4096",
                     "--host", "127.0.0.1", "--port", str(self.port), *extra]
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LlamaServer:
        out = open(self.log, "wb") if self.log else subprocess.DEVNULL  # noqa: SIM115 (closed with the process)
        self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"llama-server exited with {self.process.returncode}"
            try:
                if self._get("/health").get("status") == "ok":
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError("llama-server did not become ready in 120 s")

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=60) as response:
            return json.loads(response.read())

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.loads(response.read())

    def tokenize(self, text: str, *, parse_special: bool = True) -> list[int]:
        """llama.cpp's token ids of a text (no BOS; special-token text read as those tokens unless told not to)."""
        body = {"content": text, "parse_special": parse_special}
        return [int(t) for t in self._post("/tokenize", body)["tokens"]]

    def apply_template(self, body: dict[str, Any]) -> str:
        """The prompt llama-server's chat template renders for a chat body (messages, tools, reasoning_effort, ...;
        the server needs --jinja)."""
        return str(self._post("/apply-template", body)["prompt"])

    def greedy(self, prompt_ids: list[int], steps: int, top: int) -> list[tuple[int, dict[int, float] | None]]:
        """`steps` greedy tokens after the prompt ids (nothing cached), with their top log-probabilities (_greedy)."""
        return self._greedy(prompt_ids, steps, top, cache_prompt=False)

    def _greedy(self, prompt_ids: list[int], steps: int, top: int,
                cache_prompt: bool) -> list[tuple[int, dict[int, float] | None]]:
        """`steps` greedy tokens after the prompt ids, each with the log-probabilities of its top `top` tokens
        before sampling (llama.cpp's raw distribution), or None for a token llama-server gave none for (it drops
        the probabilities of a byte token that leaves the text invalid UTF-8)."""
        reply = self._post("/completion", {
            "prompt": prompt_ids, "n_predict": steps, "temperature": 0, "top_k": 1, "cache_prompt": cache_prompt,
            "ignore_eos": True, "n_probs": top, "post_sampling_probs": False, "return_tokens": True})
        given = list(reply["completion_probabilities"])
        run: list[tuple[int, dict[int, float] | None]] = []
        for token in (int(t) for t in reply["tokens"]):
            if given and int(given[0]["id"]) == token:
                run.append((token, {int(t["id"]): float(t["logprob"]) for t in given.pop(0)["top_logprobs"]}))
            else:
                run.append((token, None))
        assert not given, "llama-server's probabilities do not follow its tokens"
        return run

    def next_logprobs(self, ids: list[int], top: int) -> dict[int, float] | None:
        """The top `top` log-probabilities of the token after `ids` (the cached prefix is reused: one decode step
        per call when `ids` grows by one token, as a server decodes), or None where llama-server gave none for that
        token (a byte token leaving the text invalid UTF-8; see greedy)."""
        first = self.greedy_from(ids, 4, top)[0]
        return first[1]

    def greedy_from(self, ids: list[int], steps: int, top: int) -> list[tuple[int, dict[int, float] | None]]:
        """greedy() with the prompt's cached prefix reused (cache_prompt)."""
        return self._greedy(ids, steps, top, cache_prompt=True)
