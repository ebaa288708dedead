"""Each patch's check() decides by the structure of the installed code (its AST: calls, attributes,
names, definitions) or by behaviour, never by a word in its text. For every detection: a decoy
whose only mention of the word the old text search looked for is in a comment, a docstring or a
string is NOT detected (the old search said it was: asserted first, as ``word in decoy``), and
code with the real structure is. That the detections read the real releases right is checked by
the other tests (0.24.0 / 0.27.1 / 0.32.0 states)."""

from __future__ import annotations

import multiprocessing.spawn

import pytest

from vllm_intel.patches import (
    _code_shape,
    cpu_accelerator_api,
    cpu_aot_compile,
    drain_deadline,
    engine_parent_watch,
    fast_exit,
    shm_busy_sleep,
    xpu_shutdown,
)
from vllm_intel.patches._base import NEEDED, NOT_APPLICABLE, UPSTREAM
from vllm_intel.patches._code_shape import parse

# -- drain-deadline: EngineCoreProc._handle_shutdown ---------------------------------------------

DRAIN = '''
    def _handle_shutdown(self) -> bool:
        """{doc}"""
        if self.shutdown_state == EngineShutdownState.REQUESTED:
            timeout = self.vllm_config.shutdown_timeout  # {comment}
            {extra}
            aborted = self.scheduler.finish_requests(None, RequestStatus.FINISHED_ABORTED)
        logger.info("{log}")
        return True
'''


def drain(doc="", comment="", extra="pass", log="done"):
    return DRAIN.format(doc=doc, comment=comment, extra=extra, log=log)


@pytest.mark.parametrize(
    "src",
    [
        drain(doc="No deadline: uses time.monotonic() nowhere."),
        drain(comment="TODO: a deadline, monotonic clock"),
        drain(log="drain deadline reached (monotonic)"),
        drain(extra="deadline_note = 'monotonic'"),  # a name, but never compared
    ],
)
def test_drain_words_without_a_deadline_are_needed(monkeypatch, src):
    assert "deadline" in src and "monotonic" in src  # the old text search: "upstream"
    monkeypatch.setattr(drain_deadline, "code_tree", lambda *a: parse(src))
    assert drain_deadline.PATCH.check()[0] == NEEDED


@pytest.mark.parametrize(
    "extra",
    [
        "self._stop_at = time.monotonic() + timeout",
        "if now() > self.drain_deadline: return False",
        "if self._deadline is not None and clock() >= self._deadline: return False",
    ],
)
def test_drain_with_a_deadline_is_upstream(monkeypatch, extra):
    monkeypatch.setattr(drain_deadline, "code_tree", lambda *a: parse(drain(extra=extra)))
    assert drain_deadline.PATCH.check()[0] == UPSTREAM


def test_drain_mode_needs_the_attributes_not_their_names():
    src = '''
def _handle_shutdown(self):
    """reads shutdown_timeout, aborts with FINISHED_ABORTED"""
    # self.vllm_config.shutdown_timeout, RequestStatus.FINISHED_ABORTED
    return True
'''
    assert "shutdown_timeout" in src and "FINISHED_ABORTED" in src
    assert drain_deadline.drain_shape(parse(src)) == (False, False)
    assert drain_deadline.drain_shape(parse(drain())) == (True, False)


# -- xpu-shutdown: the four pieces of vLLM PR #46433 ---------------------------------------------

XPU_DECOY = {
    "vllm.platforms.xpu": '''
class XPUPlatform:
    """shutdown_timeout is left as it is."""
    @classmethod
    def check_and_update_config(cls, vllm_config):
        # TODO: vllm_config.shutdown_timeout = 5
        timeout = vllm_config.shutdown_timeout  # read, not set
''',
    "vllm.v1.worker.xpu_worker": '''
class XPUWorker:
    def shutdown(self):
        """Does not call XpuMemAllocator.instance.release_pools()."""
        super().shutdown()
''',
    "vllm.v1.worker.gpu_model_runner": """
class GPUModelRunner:
    def shutdown(self):
        # on is_xpu() we should empty the cache
        log("is_xpu()")
""",
    "vllm.v1.worker.gpu_worker": """
class Worker:
    def shutdown(self):
        # is_cuda_alike is not checked here
        if CuMemAllocator.instance is not None:
            CuMemAllocator.instance.release_pools()
""",
}
XPU_REAL = {
    "vllm.platforms.xpu": """
class XPUPlatform:
    @classmethod
    def check_and_update_config(cls, vllm_config):
        if vllm_config.shutdown_timeout == 0:
            vllm_config.shutdown_timeout = 5
""",
    "vllm.v1.worker.xpu_worker": """
class XPUWorker:
    def shutdown(self):
        super().shutdown()
        if XpuMemAllocator.instance is not None:
            XpuMemAllocator.instance.release_pools()
""",
    "vllm.v1.worker.gpu_model_runner": """
class GPUModelRunner:
    def shutdown(self):
        if current_platform.is_rocm() or current_platform.is_xpu():
            torch.accelerator.empty_cache()
""",
    "vllm.v1.worker.gpu_worker": """
class Worker:
    def shutdown(self):
        if current_platform.is_cuda_alike():
            from vllm.device_allocator.cumem import CuMemAllocator
            CuMemAllocator.instance.release_pools()
""",
}


def test_xpu_pieces_by_structure():
    old_words = ("shutdown_timeout", "release_pools", "is_xpu()", "is_cuda_alike")
    assert all(any(w in src for src in XPU_DECOY.values()) for w in old_words)
    decoy = {m: parse(s) for m, s in XPU_DECOY.items()}
    assert xpu_shutdown.missing_in(decoy) == [
        "shutdown-timeout",
        "worker-release-pools",
        "runner-cleanup",
        "cumem-cuda-only",
    ]
    assert xpu_shutdown.missing_in({m: parse(s) for m, s in XPU_REAL.items()}) == []
    # a class without the method lacks its piece
    bare = dict(XPU_REAL, **{"vllm.v1.worker.xpu_worker": "class XPUWorker:\n    pass\n"})
    assert xpu_shutdown.missing_in({m: parse(s) for m, s in bare.items()}) == [
        "worker-release-pools"
    ]
    # 0.34's runner (vllm/v1/worker/gpu/model_runner.py) empties the cache on every platform
    every = dict(XPU_REAL, **{"vllm.v1.worker.gpu_model_runner": RUNNER_0340})
    assert xpu_shutdown.missing_in({m: parse(s) for m, s in every.items()}) == []
    rocm = dict(XPU_REAL, **{"vllm.v1.worker.gpu_model_runner": RUNNER_ROCM_ONLY})
    assert xpu_shutdown.missing_in({m: parse(s) for m, s in rocm.items()}) == ["runner-cleanup"]


RUNNER_0340 = """
class GPUModelRunner:
    def shutdown(self):
        torch.accelerator.synchronize()
        if current_platform.is_rocm():
            CUDAGraphWrapper.clear_all_graphs()
        gc.collect()
        torch.accelerator.empty_cache()
"""
RUNNER_ROCM_ONLY = """
class GPUModelRunner:
    def shutdown(self):
        # empty_cache() on every platform? not here: is_xpu() is not asked
        if current_platform.is_rocm():
            torch.accelerator.empty_cache()
"""


# -- cpu-aot-compile: vllm.envs.use_aot_compile --------------------------------------------------

AOT_DECOY = '''
def use_aot_compile() -> bool:
    """Unlike vllm PR #32037 this does not ask is_cpu()."""
    # not current_platform.is_cpu()
    return os.environ.get("VLLM_USE_AOT_COMPILE", "1") == "1"
'''
AOT_REAL = """
def use_aot_compile() -> bool:
    from vllm.platforms import current_platform
    default = "1" if is_torch_equal_or_newer("2.10.0") and not current_platform.is_cpu() else "0"
    return os.environ.get("VLLM_USE_AOT_COMPILE", default) == "1"
"""


def test_aot_default_asks_is_cpu_by_structure(monkeypatch):
    assert "is_cpu" in AOT_DECOY
    assert not cpu_aot_compile.checks_cpu(parse(AOT_DECOY))
    assert cpu_aot_compile.checks_cpu(parse(AOT_REAL))
    monkeypatch.setattr(cpu_aot_compile, "code_tree", lambda *a: parse(AOT_REAL))
    assert cpu_aot_compile.PATCH.check()[0] == UPSTREAM


# -- cpu-accelerator-api: Dynamo's handle_synchronize --------------------------------------------

DYNAMO_DECOY = '''
MESSAGE = "No accelerator available for torch.accelerator.synchronize"

def handle_synchronize(self, tx, *args, **kwargs):
    """Used to raise "No accelerator available for torch.accelerator.synchronize"."""
    # No accelerator available for torch.accelerator.synchronize: now CPU
    device = torch.device("cpu")
    return None
'''
DYNAMO_REAL = """
class TorchInGraphFunctionVariable:
    def _get_handlers():
        @register(torch.accelerator.synchronize)
        def handle_synchronize(self, tx, *args, **kwargs):
            if not args:
                accelerator = torch.accelerator.current_accelerator()
                if accelerator is None:
                    raise AssertionError("some message")
"""


def test_dynamo_assertion_by_structure():
    assert "No accelerator available for torch.accelerator.synchronize" in DYNAMO_DECOY
    assert not cpu_accelerator_api.dynamo_asserts_without_accelerator(parse(DYNAMO_DECOY))
    assert cpu_accelerator_api.dynamo_asserts_without_accelerator(parse(DYNAMO_REAL))
    assert not cpu_accelerator_api.dynamo_asserts_without_accelerator(None)
    # the installed torch (2.13) still asserts
    tree = _code_shape.module_tree(cpu_accelerator_api.DYNAMO_MODULE)
    assert cpu_accelerator_api.dynamo_asserts_without_accelerator(tree)


# -- fast-exit: gc.freeze() in run_engine_core; multiprocessing's command line --------------------

FREEZE_DECOY = '''
def run_engine_core(*args, **kwargs):
    """After shutdown we could gc.freeze() (not done here)."""
    engine_core.shutdown()
    # gc.freeze()  - skip the final scan
'''
FREEZE_ROCM_ONLY = """
def run_engine_core(*args, **kwargs):
    engine_core.shutdown()
    if shutdown_timeout == 0:
        if current_platform.is_rocm():
            gc.freeze()
"""
FREEZE_EVERYWHERE = """
def run_engine_core(*args, **kwargs):
    engine_core.shutdown()
    if current_platform.is_rocm():
        torch.cuda.empty_cache()
    gc.freeze()
"""


def test_freeze_by_structure(monkeypatch):
    assert "gc.freeze()" in FREEZE_DECOY and "is_rocm()" not in FREEZE_DECOY
    assert not fast_exit.freezes_on_every_platform(parse(FREEZE_DECOY))
    assert not fast_exit.freezes_on_every_platform(parse(FREEZE_ROCM_ONLY))
    assert "is_rocm()" in FREEZE_EVERYWHERE  # the old search said: not upstream
    assert fast_exit.freezes_on_every_platform(parse(FREEZE_EVERYWHERE))
    monkeypatch.setattr(fast_exit, "code_tree", lambda *a: parse(FREEZE_EVERYWHERE))
    assert fast_exit.PATCH.check()[0] == UPSTREAM
    monkeypatch.setattr(fast_exit, "code_tree", lambda *a: parse(FREEZE_DECOY))
    assert fast_exit.PATCH.check()[0] == NEEDED


def test_spawn_command_line_by_behaviour(monkeypatch):
    assert fast_exit._spawn_builds_stdlib_program()  # this interpreter's multiprocessing

    def other(**kwds):
        """Once built 'from multiprocessing.spawn import spawn_main; spawn_main(...)'."""
        return ["/bin/frozen-python", "--multiprocessing-fork", "pipe_handle=7"]

    monkeypatch.setattr(multiprocessing.spawn, "get_command_line", other)
    assert not fast_exit._spawn_builds_stdlib_program()


# -- shm-busy-sleep: shm_broadcast.SpinCondition ----------------------------------------------------

SPIN = '''
"""Shared-memory broadcast. {doc}"""
class SpinCondition:
    def __init__(self, is_reader, context, notify_address):
        self.busy_loop_s = 1.0  # {comment}

    def record_read(self):
        self.last_read = time.monotonic()

    def notify(self):
        self.socket.send(b"")

    def wait(self, timeout_ms=None):
        {wait}
'''
SPIN_WAIT = """if time.monotonic() <= self.last_read + self.busy_loop_s:
            sched_yield()
        else:
            self.poller.poll(timeout=timeout_ms)"""
ENV = shm_busy_sleep.ENV


def spin(doc="", comment="", wait=SPIN_WAIT):
    return SPIN.format(doc=doc, comment=comment, wait=wait)


@pytest.mark.parametrize(
    "src",
    [
        spin(doc=f"Upstream reads {ENV} (PR #52848)."),
        spin(comment=f"see {ENV}"),
        spin(wait=SPIN_WAIT.replace("sched_yield()", f'log("{ENV} unset")')),
    ],
)
def test_shm_env_named_only_in_words_is_not_upstream(src):
    assert ENV in src
    assert not shm_busy_sleep.reads_env(parse(src))


@pytest.mark.parametrize(
    "read",
    [
        f"envs.{ENV}",
        f'os.getenv("{ENV}", "0")',
        f'os.environ.get("{ENV}")',
        f'os.environ["{ENV}"]',
    ],
)
def test_shm_reading_the_env_is_upstream(monkeypatch, read):
    src = spin(wait=f"pause = {read}\n        " + SPIN_WAIT)
    assert shm_busy_sleep.reads_env(parse(src))
    monkeypatch.setattr(shm_busy_sleep, "module_source", lambda name: src)
    assert shm_busy_sleep.PATCH.check()[0] == UPSTREAM


def test_shm_busy_branch_by_structure(monkeypatch):
    assert shm_busy_sleep.shape(parse(spin())) is None
    decoy = spin(
        wait='"""sched_yield() while busy_loop_s"""\n        # sched_yield() busy_loop_s\n'
        "        self.poller.poll(timeout=timeout_ms)"
    )
    assert "sched_yield()" in decoy and "busy_loop_s" in decoy
    assert shm_busy_sleep.shape(parse(decoy)) == (
        "SpinCondition.wait has no sched_yield busy branch here"
    )
    words = spin().replace("def notify", "# def notify\n    def _notify")
    assert "def notify" in words
    assert shm_busy_sleep.shape(parse(words)) == "SpinCondition has no notify / record_read here"
    named = '"""class SpinCondition: gone"""\nclass Other:\n    pass\n'
    monkeypatch.setattr(shm_busy_sleep, "module_source", lambda name: named)
    assert shm_busy_sleep.PATCH.check() == (
        NOT_APPLICABLE,
        "this vLLM has no SpinCondition (shm_broadcast)",
    )


# -- engine-parent-watch: vllm/v1/engine/core.py ------------------------------------------------

CORE_DECOY = '''
"""The engine core. Unlike vllm PR #55846 it has no death_pipe; no PR_SET_PDEATHSIG, no
pidfd_open, no getppid() (vllm issue #55510)."""
import os

class EngineCoreProc:
    @staticmethod
    def run_engine_core(*args, **kwargs):
        # TODO: monitor_parent_death(), os.getppid()
        logger.info("no death_pipe")
'''
CORE_REAL = {
    "pipe": "death_pipe = kwargs.pop('death_pipe', None)",
    "prctl": "libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)",
    "pidfd": "fd = os.pidfd_open(ppid)",
    "poll": "threading.Thread(target=monitor_parent_death).start()",
}


def test_parent_watch_named_only_in_words_is_not_upstream(monkeypatch):
    assert all(m in CORE_DECOY for m in engine_parent_watch.UPSTREAM_MARKERS)
    assert engine_parent_watch.watches_parent(parse(CORE_DECOY)) == []
    monkeypatch.setattr(engine_parent_watch, "module_source", lambda m: CORE_DECOY)
    assert engine_parent_watch.PATCH.check()[0] != UPSTREAM


@pytest.mark.parametrize("how", sorted(CORE_REAL))
def test_parent_watch_in_code_is_upstream(monkeypatch, how):
    src = CORE_DECOY.replace("logger.info", CORE_REAL[how] + "\n        logger.info")
    assert engine_parent_watch.watches_parent(parse(src))
    monkeypatch.setattr(engine_parent_watch, "module_source", lambda m: src)
    assert engine_parent_watch.PATCH.check()[0] == UPSTREAM


def test_run_engine_core_must_be_defined(monkeypatch):
    src = '"""def run_engine_core is gone"""\nclass EngineCoreProc:\n    pass\n'
    monkeypatch.setattr(engine_parent_watch, "module_source", lambda m: src)
    assert engine_parent_watch.PATCH.check()[0] == NOT_APPLICABLE


# -- the helpers ----------------------------------------------------------------------------------


def test_helpers_ignore_comments_and_strings():
    tree = parse(
        '''
    def f(self, arg):
        """sched_yield() deadline"""
        # sched_yield()
        x = "self.deadline"
        self.a.b = obj.c(arg)
    '''
    )
    assert not _code_shape.calls_to(tree, "sched_yield")
    assert [_code_shape.dotted(c.func) for c in _code_shape.calls_to(tree, "c")] == ["obj.c"]
    assert "deadline" not in _code_shape.identifiers(tree)
    assert {"f", "self", "arg", "x", "a", "b", "obj", "c"} <= _code_shape.identifiers(tree)
    assert _code_shape.stored_attributes(tree) == {"b"}
    assert (
        _code_shape.find_def(tree, "f") is not None and _code_shape.find_def(tree, "f", "g") is None
    )


# -- cpu-accelerator-noops: already by AST (binders of the two torch.accelerator names) ----------


def test_noops_binders_by_structure():
    from vllm_intel.patches import cpu_accelerator_noops as noops

    decoy = '''
"""torch.accelerator.synchronize = noop; torch.accelerator.empty_cache = noop"""
# torch.accelerator.synchronize = noop
# torch.accelerator.empty_cache = noop
x = "torch.accelerator.empty_cache = noop"
'''
    assert noops._bound_names(parse(decoy), None) == {}
    real = "torch.accelerator.synchronize = noop\ntorch.accelerator.empty_cache = noop\n"
    assert noops._bound_names(parse(real), None) == {"synchronize": "noop", "empty_cache": "noop"}
