"""The tiny model's files in a Hugging Face hub cache layout (what `hf download` or vLLM leave
behind), so it can be served offline by repo id."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil

# A commit hash as the hub names snapshots (any 40 hex digits; refs/main points at it).
REVISION = "0123456789abcdef0123456789abcdef01234567"
REPO = "vllm-intel-test/tiny-llama"  # a repo id no hub has: served only from a cache


def hub_layout(
    src: pathlib.Path, cache: pathlib.Path, repo: str, rev: str = REVISION
) -> pathlib.Path:
    """src's files as the hub cache keeps them: cache/models--ORG--NAME/blobs/<sha256>,
    snapshots/<rev>/<file> -> ../../blobs/<sha256> (relative symlinks), refs/main = rev."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / rev
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = f.relative_to(src)
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        blob = root / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(f, blob)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(rev)
    return snap
