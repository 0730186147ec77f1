"""The dense part's arithmetic, and what `auto` takes on this machine.

fp32, or bf16: the dense part (MLPs, interactions) under torch.autocast, whose matrix
products then run in bfloat16 while its weights, their gradients and Adam's state stay
fp32, as do the embedding tables and their fused updates (models.common.dense_autocast).

`auto`, the default, takes bf16 where the hardware runs it natively and fp32 elsewhere:
on a CPU without AVX-512 BF16 or AMX, autocast's bf16 is emulated and slower than fp32.
Where a model is known to lose more than 0.002 AUC in bf16 (a learning test, or
benchmarks.movielens --sweep precision), auto keeps it in fp32 (FP32_MODELS); the README's
precision note has the figures.

Torch-free, so that the command line can offer the choices without importing torch.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)

DENSE_PRECISIONS = ("fp32", "bf16")  # what a model is built and checkpointed in
PRECISIONS = ("auto", *DENSE_PRECISIONS)  # what a run may ask for
CPU_BF16_UNITS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo's flags for native bf16
# Models that auto keeps in fp32 because a learning test or benchmarks.movielens showed
# them losing more than 0.002 AUC in bf16 (none so far; see the README's precision note).
FP32_MODELS: frozenset[str] = frozenset()


def check_precision(precision: str, allowed: tuple[str, ...] = PRECISIONS) -> None:
    if precision not in allowed:
        raise ValueError(f"precision must be one of {allowed}, got {precision!r}")


@functools.lru_cache(maxsize=1)
def cpu_info() -> dict[str, str]:
    """The first CPU's entries in Linux's /proc/cpuinfo (model name, flags, ...); empty
    where there is none."""
    entries: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                if not key.strip():  # the first CPU's entries end at a blank line
                    break
                entries.setdefault(key.strip(), value.strip())
    except OSError:  # not Linux
        pass
    return entries


def cpu_flags() -> frozenset[str]:
    return frozenset(cpu_info().get("flags", "").split())


def cpu_bf16_units() -> list[str]:
    """This CPU's native bf16 units, by their cpuinfo flag."""
    flags = cpu_flags()
    return [unit for unit in CPU_BF16_UNITS if unit in flags]


def native_bf16(device_type: str, cuda_bf16: bool = False) -> str | None:
    """What runs bf16 natively on a `device_type` (cpu, cuda), or None; `cuda_bf16`:
    whether the GPU does (torch.cuda.is_bf16_supported)."""
    if device_type == "cuda":
        return "the GPU" if cuda_bf16 else None
    units = cpu_bf16_units() if device_type == "cpu" else []
    return f"the CPU's {' and '.join(units)}" if units else None


def choose_precision(requested: str, model: str, device_type: str, cuda_bf16: bool = False) -> str:
    """fp32 or bf16, for a run of `model` that asked for `requested` on a `device_type`."""
    check_precision(requested)
    if requested != "auto":
        return requested
    return "bf16" if native_bf16(device_type, cuda_bf16) and model not in FP32_MODELS else "fp32"


_said: set[str] = set()


def say_precision(precision: str, model: str, device_type: str, cuda_bf16: bool = False) -> None:
    """Log, once per process and precision, which one the dense part runs in and what the
    device has for it, so that a run's log says what auto took."""
    native = native_bf16(device_type, cuda_bf16)
    if precision == "bf16":
        why = f"on {native}" if native else f"emulated: the {device_type.upper()} has no native bf16"
    elif model in FP32_MODELS:
        why = f"{model} loses AUC in bf16"
    else:
        why = f"{native} is there: --precision auto or bf16 would use it" if native else \
            f"the {device_type.upper()} has no native bf16 (avx512_bf16, amx_bf16)"
    line = f"dense part in {precision} ({why})"
    if line not in _said:
        _said.add(line)
        log.info("%s", line)
