"""A model from a Hugging Face hub: where its cache is, `entrypoint.py prefetch`, and the download
progress the supervisor logs while vLLM is still STARTING (an extension of the loop).

Only huggingface_hub's public API and its documented cache layout
(HF_HUB_CACHE/models--ORG--NAME/{blobs,snapshots,refs}); a download in progress is a blob named
`*.incomplete` until it is complete and renamed.
"""

from __future__ import annotations

import os
import pathlib
import re
import threading
import time

from . import errors, paths
from .errors import Exit
from .extension import Extension
from .log import log
from .state import State
from .vllm_args import VllmArgs, resolve

PROGRESS_S = 10  # how often the download progress is logged
# A repo id: NAME or ORG/NAME (huggingface_hub's own rule, without a hub round trip).
REPO_ID = re.compile(r"[\w][\w.-]{0,95}(/[\w][\w.-]{0,95})?")
# What vLLM's default loader reads next to the weights (config, tokenizer, chat template...).
AUX_FILES = re.compile(r"[^/]+\.(json|txt|model|tiktoken|jinja|py)")
# Weight formats in vLLM's order of preference (DefaultModelLoader): the first one present wins,
# the others are not downloaded. Files under original/ are another checkpoint layout it skips.
WEIGHTS = (".safetensors", ".bin", ".pt")


def online(env=os.environ) -> bool:
    """huggingface_hub's own reading of HF_HUB_OFFLINE (1/ON/YES/TRUE = offline)."""
    return env.get("HF_HUB_OFFLINE", "").strip().upper() not in {"1", "ON", "YES", "TRUE"}


def cache_dir(env=os.environ) -> pathlib.Path:
    """HF_HUB_CACHE as huggingface_hub resolves it."""
    explicit = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return paths.user_path("HF_HUB_CACHE", explicit)
    if env.get("HF_HOME"):
        return paths.user_path("HF_HOME", env["HF_HOME"]) / "hub"
    cache = env.get("XDG_CACHE_HOME") or str(paths.user_path("the home directory", "~/.cache"))
    return paths.user_path("XDG_CACHE_HOME", cache) / "huggingface" / "hub"


def repo_id(model: str | None) -> str | None:
    """model if it names a hub repository, None for a local path (or nothing)."""
    if not model or paths.looks_like_path(model) or paths.path_exists("model", pathlib.Path(model)):
        return None
    return model if REPO_ID.fullmatch(model) else None


def repo_dir(cache: pathlib.Path, repo: str) -> pathlib.Path:
    return cache / ("models--" + repo.replace("/", "--"))


def progress(cache: pathlib.Path, repo: str) -> tuple[int, int, int]:
    """(bytes in complete blobs, bytes in partial blobs, number of partial blobs) of one repo."""
    done = partial = n = 0
    try:
        entries = list(os.scandir(repo_dir(cache, repo) / "blobs"))
    except OSError:
        return 0, 0, 0
    for e in entries:
        try:
            size = e.stat(follow_symlinks=False).st_size
        except OSError:  # renamed or removed while we looked
            continue
        if e.name.endswith(".incomplete"):
            partial, n = partial + size, n + 1
        elif not e.name.endswith(".lock"):
            done += size
    return done, partial, n


def human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def progress_line(cache: pathlib.Path, repo: str, total: int | None = None) -> str:
    done, partial, n = progress(cache, repo)
    have = done + partial
    of = f" of {human(total)} ({100 * have / total:.0f} %)" if total else ""
    return f"downloading {repo}: {human(have)}{of} in {cache}" + (
        f", {n} file{'s' if n != 1 else ''} in progress" if n else ""
    )


class Progress:
    """Logs progress_line when the bytes of `repo`'s download into `cache` changed since the last
    look: one directory listing a look, nothing when nothing changed."""

    def __init__(self, cache: pathlib.Path, repo: str, total: int | None = None):
        self.cache, self.repo, self.total = cache, repo, total
        self.last = progress(cache, repo)

    def look(self) -> None:
        now = progress(self.cache, self.repo)
        if now != self.last:
            log(progress_line(self.cache, self.repo, self.total))
            self.last = now


class ProgressLogger(threading.Thread):
    """prefetch's: a look every PROGRESS_S while the download runs in the caller's thread."""

    def __init__(self, cache: pathlib.Path, repo: str, total: int | None = None):
        super().__init__(name="hub-progress", daemon=True)
        self.progress = Progress(cache, repo, total)
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(PROGRESS_S):
            self.progress.look()

    def stop(self) -> None:
        self.stopped.set()


class DownloadProgress(Extension):
    """serve's: while vLLM is STARTING (and downloads `repo` into `cache`), a look every
    PROGRESS_S from the loop's tick; no thread."""

    def __init__(self, cache: pathlib.Path, repo: str):
        self.cache, self.repo = cache, repo
        self.progress: Progress | None = None
        self.next_at = 0.0

    def on_spawn(self, sup) -> None:
        self.progress = Progress(self.cache, self.repo)
        self.next_at = time.monotonic() + PROGRESS_S

    def on_tick(self, sup) -> None:
        if self.progress and sup.state == State.STARTING and time.monotonic() >= self.next_at:
            self.next_at = time.monotonic() + PROGRESS_S
            self.progress.look()


def download_progress(cfg, env=os.environ) -> DownloadProgress | None:
    """The progress of what `vllm serve` will fetch, if it fetches anything. cfg: the ServeConfig
    (its model as vLLM resolves it: positional, --model or the --config file's; its resolved vLLM
    settings). None: a local model or the hub off."""
    repo = repo_id(cfg.model)
    if repo is None or not online(env):
        return None
    return DownloadProgress(serve_cache(cfg.vargs, env), repo)


def choose_files(names: list[str]) -> list[str]:
    """The files of a repository vLLM's default loader reads: one weight format, plus config and
    tokenizer files at the top level."""
    top = [n for n in names if not n.startswith("original/")]
    for ext in WEIGHTS:
        weights = [n for n in top if n.endswith(ext)]
        if weights:
            break
    else:
        weights = []
    index = [n for n in top if n.endswith(".index.json")]
    return sorted(set(weights) | set(index) | {n for n in top if AUX_FILES.fullmatch(n)})


def serve_cache(found: VllmArgs, env=os.environ) -> pathlib.Path:
    """Where `vllm serve` keeps the hub's files: its --download-dir, else the hub cache."""
    return pathlib.Path(found.download_dir) if found.download_dir else cache_dir(env)


def prefetch(args: list[str], env=os.environ) -> int:
    """`entrypoint.py prefetch [MODEL] [FLAGS]`: download what `entrypoint.py serve [MODEL]
    [FLAGS]` would (the model, --revision, into --download-dir or the hub cache, from the command
    line or its --config file, as vLLM reads them; the other serve flags are ignored) before
    serve starts, e.g. in a Kubernetes init container given the server's arguments, so the
    startupProbe only covers loading and compiling. A local path or HF_HUB_OFFLINE=1: nothing to
    do, exit 0."""
    found = resolve(args)
    model = found.model or env.get("INTEL_VLLM_MODEL")
    revision = found.revision
    if model:
        paths.check_model_path(model)
    repo = repo_id(model)
    if repo is None:
        log(
            f"prefetch: {errors.shown(model or 'the built-in model', 200, quote=False)} is local, nothing to download"
        )
        return 0
    cache = serve_cache(found, env)
    if not online(env):
        log(f"prefetch: HF_HUB_OFFLINE is set, not downloading {repo} (serve uses {cache})")
        return 0
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()  # \r-redrawn bars make noise in container logs; ProgressLogger
    except ImportError as e:
        log(f"prefetch: huggingface_hub cannot be imported: {e}")
        return Exit.NOT_FOUND
    try:
        listing = snapshot_download(repo, revision=revision, cache_dir=cache, dry_run=True)
        files = choose_files([f.filename for f in listing])
        total = sum(f.file_size or 0 for f in listing if f.filename in files)
        todo = sum(f.file_size or 0 for f in listing if f.filename in files and f.will_download)
        log(
            f"prefetch: {repo}{'@' + revision if revision else ''}: {len(files)} files, "
            f"{human(total)}, {human(todo)} to download into {cache}"
        )
        t0 = time.monotonic()
        logger = ProgressLogger(cache, repo, total)
        logger.start()
        try:
            path = snapshot_download(repo, revision=revision, cache_dir=cache, allow_patterns=files)
        finally:
            logger.stop()
    except Exception as e:  # noqa: BLE001 - any failure here is "could not download": one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        log(f"prefetch: cannot download {repo}: {type(e).__name__}: {first}")
        return Exit.PREFETCH
    log(f"prefetch: {repo} complete in {time.monotonic() - t0:.0f} s: {path}")
    return 0
