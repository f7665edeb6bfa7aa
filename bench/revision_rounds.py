"""Rounds of one measurement in this tree and in a git revision, alternating, so that background load hits both
alike: the revision is checked out into a temporary git worktree, and each round runs the calling script (this
tree's file) again as a child (`--child` plus its own arguments) in a subprocess whose imports come from that tree
(PYTHONPATH, and the tree as the working directory). The child prints one JSON object as its last line;
`alternate` returns them per tree, in round order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # this tree's root


def run_child(script: str, tree: Path, arguments: list[str]) -> dict[str, float]:
    """`script` (the caller's __file__) run as a child with `tree`'s imports: the JSON of its last line."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, script, "--child", *arguments], cwd=tree, env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def alternate(script: str, arguments: list[str], ref: str, rounds: int) -> dict[str, list[dict[str, float]]]:
    """`rounds` rounds of the child, in this tree ("this tree") then in `ref` ("ref REF"; none when empty)."""
    trees = {"this tree": HERE}
    with tempfile.TemporaryDirectory() as tmp:
        if ref:
            ref_tree = Path(tmp) / "ref"
            subprocess.run(["git", "worktree", "add", "-q", "--detach", str(ref_tree), ref], cwd=HERE, check=True)
            trees[f"ref {ref}"] = ref_tree
        try:
            results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
            for _ in range(rounds):
                for name, tree in trees.items():
                    results[name].append(run_child(script, tree, arguments))
        finally:
            if ref:
                subprocess.run(["git", "worktree", "remove", "--force", str(ref_tree)], cwd=HERE, check=False)
    return results
