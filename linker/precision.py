"""How an encoder runs on this machine: precision (fp32, bf16, int8) and thread count.

One setting, ``auto|fp32|bf16|int8``, decides how every encoder runs: at index build, at query
time (CLI, service, eval, normalise) and in training.

- ``fp32``: the reference.
- ``bf16``: forward passes under ``torch.autocast(dtype=bfloat16)``: matrix products in bf16,
  weights kept in fp32 (layer norms, softmax and pooling stay fp32). Fast only where the
  processor multiplies bf16 natively (x86 ``avx512_bf16`` or ``amx_bf16``; a CUDA GPU with
  bf16); elsewhere oneDNN emulates it, slower than fp32, so `auto` does not pick it there.
- ``int8``: ``torch.ao.quantization.quantize_dynamic`` of the transformer's Linear layers
  (weights int8 per channel, activations quantised per batch). CPU only; fast with VNNI
  (``avx512_vnni``, ``avx_vnni``, ``amx_int8``). Inference only.
- ``auto``: the fastest of `AUTO_CHOICES` that this processor supports natively; an index
  build also checks it against fp32 on a sample of its own names (`linker.index.dense`) and
  falls back to fp32 when the check fails.

Which precisions `auto` may choose is decided by the parity measured on real benchmarks
(NCBI-disease, Cantemist; eval/bench/bench_encode.md).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from functools import lru_cache
from pathlib import Path
from typing import Any

from linker.errors import ConfigError, UnknownNameError
from linker.extras import require

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "fp32", "bf16", "int8")
# Fastest first. A precision is an auto choice only once it met the parity bar on the real
# benchmarks (top-1 agreement with fp32 >= 99.5%, Acc@1 within 0.3 points; eval/bench/bench_encode.md):
# bf16 did on NCBI-disease (minilm) and Cantemist (e5-small); int8 (dynamic, per-tensor weights)
# did not (top-1 agreement 92-94%, vector cosine to fp32 down to 0.82), so it is opt-in only.
AUTO_CHOICES = ("bf16",)
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def check_precision(precision: str | None, *, allow_none: bool = True) -> str | None:
    """Validate a precision name (None means "not given" where allowed)."""
    if precision is None and allow_none:
        return None
    if precision not in PRECISIONS:
        raise UnknownNameError("precision", str(precision), PRECISIONS)
    return precision


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The processor's feature flags (Linux /proc/cpuinfo); empty where that file is absent."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def native_precisions(device: str = "cpu") -> tuple[str, ...]:
    """Precisions this device runs natively (fast), fp32 first."""
    torch = require("torch", extra="dense", what="an encoder")

    if device.startswith("cuda"):
        return ("fp32", "bf16") if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else ("fp32",)
    flags = cpu_flags()
    found = ["fp32"]
    if any(f in flags for f in BF16_FLAGS):
        found.append("bf16")
    if any(f in flags for f in INT8_FLAGS) and torch.backends.quantized.supported_engines:
        found.append("int8")
    return tuple(found)


def resolve_precision(requested: str | None, *, device: str = "cpu", recorded: str | None = None) -> str:
    """The concrete precision to run: `requested`, else `recorded` (an index's), else fp32.

    ``auto`` becomes the first of `AUTO_CHOICES` that the device runs natively, or fp32. A
    recorded bf16/int8 that this device does not run natively becomes fp32 (the vectors agree
    within the parity bar, and emulated bf16 is slower than fp32); an explicit request is
    honoured as given, except int8 on a GPU.
    """
    check_precision(requested)
    if requested is not None and requested != "auto":
        if requested == "int8" and not device.startswith("cpu"):
            raise ConfigError(f"precision int8 runs on the CPU only, found device {device!r}; use bf16 or fp32")
        return requested
    if requested is None and recorded in (None, "fp32"):
        return "fp32"  # decided without asking torch: a query path that runs without it (linker.runtime)
    native = native_precisions(device)
    if requested == "auto":
        return next((p for p in AUTO_CHOICES if p in native), "fp32")
    if recorded not in native:
        log.info("index encoded in %s; this %s does not run it natively, queries are encoded in fp32", recorded, device)
        return "fp32"
    return recorded


def autocast(precision: str, device: str = "cpu"):
    """The context a forward pass runs in: bf16 autocast, or nothing."""
    if precision != "bf16":
        return nullcontext()
    torch = require("torch", extra="dense", what="an encoder")

    return torch.autocast(device_type="cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16)


def quantize_int8(module):
    """Dynamic int8 quantisation of `module`'s Linear layers, in place (CPU inference only)."""
    torch = require("torch", extra="dense", what="an encoder")

    engines = torch.backends.quantized.supported_engines
    for engine in ("x86", "fbgemm", "onednn"):
        if engine in engines:
            torch.backends.quantized.engine = engine
            break
    else:
        raise ConfigError(f"precision int8: this torch build has no CPU quantisation engine (found {engines})")
    with warnings.catch_warnings():  # torch 2.10+ marks torch.ao.quantization deprecated (torchao replaces it)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*")
        return torch.ao.quantization.quantize_dynamic(module, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup CPU quota (containers)."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        count = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(count, math.ceil(quota) if quota else count))


def thread_budget(wanted: int) -> int:
    """`wanted` threads, capped by this process's share of the machine: OMP_NUM_THREADS when set (Ray
    sets it to an actor's CPU reservation, 1 for a normaliser worker, and a library that starts its
    own threads must keep to it too), the CPUs it may use, and the calling thread's `cores_share`."""
    cap = available_cpus()
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        cap = min(cap, int(omp))
    share = getattr(_share, "threads", None)
    if share:
        cap = min(cap, share)
    return max(1, min(wanted, cap))


_share = threading.local()


@contextmanager
def cores_share(threads: int):
    """Model calls made on this thread meanwhile start at most `threads` threads of their own (`thread_budget`):
    the service's inference pool gives each step its share of the cores, all of them while its other queues are
    idle (`linker.service.batcher.InferencePool`)."""
    before = getattr(_share, "threads", None)
    _share.threads = max(1, threads)
    try:
        yield
    finally:
        _share.threads = before


# Kept threads, one pool per process (keyed by its id: a forked child inherits the record but not the threads): a
# one-mention link would otherwise start and join a thread per call in each of its steps (the scan, the re-ranker).
# Its size, the CPUs less the caller's own, covers every caller: each asks for at most `thread_budget` threads.
_kept: dict[int, ThreadPoolExecutor] = {}
_kept_lock = threading.Lock()


def _kept_pool() -> ThreadPoolExecutor:
    with _kept_lock:
        if (pid := os.getpid()) not in _kept:
            _kept[pid] = ThreadPoolExecutor(max(1, available_cpus() - 1), thread_name_prefix="linker-worker")
        return _kept[pid]


def in_threads(run: Callable[[Any], None], items: Iterable, workers: int) -> None:
    """`run(item)` for every item, on up to `workers` threads: the calling thread and `workers - 1` kept ones each
    take the next item until none is left (items may differ in cost by orders of magnitude, so equal shares would
    leave one thread waiting). For numpy, FAISS or a kernel that releases the GIL. The caller takes its share
    itself, and a helper still queued behind another caller's work when the items run out is cancelled: concurrent
    callers sharing the kept threads never wait on each other's work. After an error no thread takes a new item;
    the first error is raised here once every thread has stopped."""
    items = list(items)
    workers = min(workers, len(items))
    if workers <= 1:
        for item in items:
            run(item)
        return
    queue = iter(items)  # next() on a list iterator is atomic under the GIL
    errors: list[BaseException] = []

    def drain() -> None:
        for item in queue:
            if errors:
                return
            try:
                run(item)
            except BaseException as exc:  # noqa: BLE001 - raised by the caller, once every thread has stopped
                errors.append(exc)
                return

    helpers = [_kept_pool().submit(drain) for _ in range(workers - 1)]
    drain()
    for helper in helpers:
        if not helper.cancel():  # cancelled: still queued behind another caller's work, nothing of ours left
            helper.result()
    if errors:
        raise errors[0]


@lru_cache(maxsize=1)
def _cgroup_quota() -> float | None:
    """CPUs allowed by cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``; None when unlimited. Read once
    per process: `thread_budget` asks on every tf-idf search, and the files cost ~40 us a read."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def default_threads() -> int:
    """torch's own default (physical cores of the machine) capped by what this process may use."""
    torch = require("torch", extra="dense", what="an encoder")

    return max(1, min(torch.get_num_threads(), available_cpus()))


__all__ = [
    "AUTO_CHOICES", "PRECISIONS", "autocast", "available_cpus", "check_precision", "cpu_flags", "default_threads",
    "in_threads", "native_precisions", "quantize_int8", "resolve_precision",
]
