"""The C++ CPU backend: kernels/csrc/packed_embedding.cpp (lookup, fused update, and row
gradients as a fused update: see reference.row_gradients_by_sgd_step) and
kernels/csrc/hot_cache.cpp (the cache's per-batch bookkeeping) and kernels/csrc/id_map.cpp
(a dynamic table's id -> row map: see id_map_reference.py) and kernels/csrc/key_index.cpp
(the sample join's index of its records: picasso.key_index), built on first use as one
extension, picasso_kernels (kernels/csrc/picasso_kernels.cpp compiles them as one unit).

torch.utils.cpp_extension compiles it against the torch already installed (no build
isolation, so never a second torch) and caches the build under
$PICASSO_KERNEL_CACHE (default ~/.cache/picasso/kernels), one folder per environment
(sys.prefix), torch version, CPU instruction set and version of the sources: later
imports load it in milliseconds, from any copy of these sources (the installed package,
or the one a model version carries), an edited source gets a build of its own, and two
virtual environments never share, nor rebuild, each other's build. Builds are serialised by build_lock.py, whose lock dies with its holder:
torch's own lock file does not, and a builder killed mid-build would hang every later import.

Built at install instead: `python -m picasso.kernels.build` builds them into that folder now
(setup.py runs it when picasso is installed from an sdist or wheel build; see build.py).
PICASSO_KERNELS_PREBUILT=1 then loads only that build and never compiles: without one, the
import raises "kernels were not built at install: run python -m picasso.kernels.build"
(the dispatch in __init__.py then falls back to the reference kernels with that warning,
unless PICASSO_KERNELS=cpu forces this backend). It needs no compiler or ninja at run time.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
import sysconfig
import threading
from pathlib import Path

import torch
from torch.utils import cpp_extension

from picasso.kernels.build_lock import build_lock
from picasso.kernels.cross_ids_cpu import crosser
from picasso.kernels.decode_ids_cpu import decoder
from picasso.kernels.decode_pack_cpu import fused_packer
from picasso.kernels.pack_groups_cpu import packer
from picasso.kernels.reference import SparseOptimizer, row_gradients_by_sgd_step

_SOURCES = Path(__file__).with_name("csrc")
_UNIT = "picasso_kernels.cpp"  # includes the others
_SOURCE_FILES = (_UNIT, "packed_embedding.cpp", "hot_cache.cpp", "id_map.cpp", "key_index.cpp", "decode_ids.cpp",
                 "pack_groups.cpp", "cross_ids.cpp", "decode_pack.cpp", "hashing.h")
_NO_FLAGS = torch.zeros(0, dtype=torch.bool)
_NO_LIMITS = torch.zeros(0, dtype=torch.int64)
_NO_SCRATCH = torch.zeros(0, dtype=torch.int32)
# -fopenmp: ATen's parallel_for is a header template that is only parallel when the
# extension itself is built with OpenMP. At run time the libgomp.so.1 that torch has
# already loaded serves it, so there is one OpenMP runtime in the process.
# -march: this CPU's instruction set by default. PICASSO_KERNEL_MARCH names a portable one
# instead (e.g. x86-64-v3) for a build made on one machine and run on others: a worker image.
# Tuples, passed as fresh lists: cpp_extension.load appends to the lists it is given.
_MARCH = os.environ.get("PICASSO_KERNEL_MARCH", "native")
_CFLAGS = ("-O3", "-fopenmp", *((f"-march={_MARCH}",) if os.uname().machine == "x86_64" else ()))
_LDFLAGS = ("-fopenmp",)


def _build_key() -> str:
    """What a build is only good for: this environment (two virtual environments with one
    torch would otherwise rebuild each other's kernels in one folder), this torch, and this
    CPU's instruction set when the build uses -march=native (a cache carried to another CPU
    must not be loaded there; a portable -march is good on any CPU that runs it)."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    if _MARCH != "native":
        flags = ""
    environment = Path(sys.prefix).resolve()
    # The compiler flags too: a PICASSO_KERNELS_PREBUILT load trusts the folder, with no
    # ninja to notice that a build was made with others.
    compile_flags = " ".join((*_CFLAGS, *_LDFLAGS))
    key = f"{environment}|{torch.__version__}|{os.uname().machine}|{flags}|{_sources_digest()}|{compile_flags}"
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    return f"torch{torch.__version__.split('+')[0]}-{digest}"


def _sources_digest() -> str:
    """The C++ sources' contents: a folder holds the build of one version of them, so an
    edited copy (a dev tree beside an older model version's) never rebuilds over another."""
    digest = hashlib.sha1()
    for source in _SOURCE_FILES:
        digest.update(source.encode() + b"\0" + (_SOURCES / source).read_bytes())
    return digest.hexdigest()


def _source_in(cache: Path, source: str) -> Path:
    """The source, copied into the build folder, and built from there. ninja keys its
    build by the source's path: the installed package and the copy of picasso that a
    model version carries (mlflow models serve loads that one) would each find the
    other's build stale and rebuild it, a minute per first request."""
    data = (_SOURCES / source).read_bytes()
    target = cache / source
    if not target.is_file() or target.read_bytes() != data:
        staged = cache / f".{source}.tmp"
        staged.write_bytes(data)
        os.replace(staged, target)  # a reader sees the old file or the new, never half
    return target


def build_directory() -> Path:
    """Where this environment's kernels are built and cached."""
    root = Path(os.environ.get("PICASSO_KERNEL_CACHE", Path.home() / ".cache" / "picasso" / "kernels"))
    return root / _build_key()


def _build(name: str):
    cache = build_directory()
    if os.environ.get("PICASSO_KERNELS_PREBUILT") == "1":
        return _load_prebuilt(name, cache)
    cache.mkdir(parents=True, exist_ok=True)
    with build_lock(cache), _this_environments_ninja():
        # Every source copied in, the unit built: ninja sees the included ones through the
        # compiler's dependency file, so an edit to any of them rebuilds.
        for source in _SOURCE_FILES:
            _source_in(cache, source)
        return cpp_extension.load(
            name=name,
            sources=[str(cache / _UNIT)],
            extra_cflags=list(_CFLAGS),
            extra_ldflags=list(_LDFLAGS),
            build_directory=str(cache),
            verbose=False,
        )


@contextlib.contextmanager
def _this_environments_ninja():
    """PATH with this environment's scripts folder first while cpp_extension runs `ninja`
    from it: the ninja that setup.py installs beside picasso, whatever else is on PATH.
    ninja versions keep their log (.ninja_log) differently and each takes the other's build
    for stale, so two processes of one environment, one started with the environment on
    PATH and one not (a server started by its full path; the processes a test starts),
    would each rebuild the folder the other built: half a minute at every start."""
    scripts = sysconfig.get_path("scripts")
    before = os.environ.get("PATH")
    if not (Path(scripts) / "ninja").exists():
        yield  # no ninja of its own: the one on PATH, as before
        return
    os.environ["PATH"] = os.pathsep.join([scripts, *([before] if before else [])])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before


def _load_prebuilt(name: str, cache: Path):
    """The library that cpp_extension.load built in `cache`, imported as it is: no compiler,
    no ninja, and an error, never a build, where there is none."""
    library = cache / f"{name}.so"
    if not library.is_file():
        raise RuntimeError(f"kernels were not built at install: run python -m picasso.kernels.build "
                           f"(PICASSO_KERNELS_PREBUILT=1 and no {library})")
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_kernels = _build("picasso_kernels")
_ops, _cache_ops, _id_map_ops = _kernels.packed_embedding, _kernels.hot_cache, _kernels.id_map
# lookup_many writes into views given to it (kernels.lookup_many's `into`), at any sample stride.
WRITES_INTO = True
# The sample join's index of its records, int64 keys to int64 values: picasso.key_index.
key_index = _kernels.key_index
# A batch's id columns decoded in one call: decode_ids_cpu.py, over csrc/decode_ids.cpp.
decode_ids = decoder(_kernels.decode_ids.decode)
# A packing group's ids in one call: pack_groups_cpu.py, over csrc/pack_groups.cpp.
pack_group = packer(_kernels.pack_groups.pack)
# A batch's feature crosses in one call: cross_ids_cpu.py, over csrc/cross_ids.cpp.
cross_ids = crosser(_kernels.cross_ids.cross)
# A raw Arrow batch decoded, checked and packed in one call: decode_pack_cpu.py, over
# csrc/decode_pack.cpp.
decode_pack = fused_packer(_kernels.decode_pack.decode_pack, _kernels.decode_pack.Plan)
# One int32 per table row, all -1 between calls: the de-duplication scratch of fused_update
# (when no field_rows are given) and of the cache ops, kept so that no call pays for filling
# it. One buffer, as long as the largest table yet, whose first `rows` entries serve any
# table: a GBA worker's compact tables change size every batch, and one buffer per size
# would grow without bound. Per thread: a step computing in one thread and the next batch
# being prepared in another must not share one.
_scratch = threading.local()


def _scratch_for(rows: int) -> torch.Tensor:
    held = getattr(_scratch, "buffer", None)
    if held is None or held.numel() < rows:
        held = _scratch.buffer = torch.full((rows,), -1, dtype=torch.int32)
    return held[:rows]


def _flags(mean_pooled):
    return _NO_FLAGS if mean_pooled is None else mean_pooled.to(torch.bool).contiguous()


def _limits(max_len):
    return _NO_LIMITS if max_len is None else max_len.to(torch.int64).contiguous()


# The outputs of the current batch size, each reused once nothing else holds it. A pooled
# lookup is batch x fields x dim floats (100+ MB at 400 fields); glibc serves each such
# block with a fresh mmap, and first touching it costs ~25k page faults, as long as the
# lookup itself. A step makes lookups of several shapes (one per group, and Wide&Deep's deep
# and wide tables), so every shape keeps its buffers (a few: two groups can share a shape);
# a new batch size drops them all. Reuse is safe only when no tensor, view or saved
# activation shares the storage: its use count is then ours alone. Per thread, as the
# scratch is: a buffer handed to a lookup running in one thread (the GIL released) still
# counts as free to another, since a tensor passed to the op does not raise its storage's
# use count; two models scoring side by side (serving, a test's threads) would write into
# one buffer.
_kept = threading.local()
_KEPT_PER_SHAPE = 4


def _kept_outputs() -> dict[tuple[int, ...], list[torch.Tensor]]:
    held = getattr(_kept, "outputs", None)
    if held is None:
        held = _kept.outputs = {}
    return held


def _is_free(kept: torch.Tensor) -> bool:
    # Two users when free: our kept tensor, and the storage handle asked for here.
    return torch._C._storage_Use_Count(kept.untyped_storage()._cdata) <= 2


def _output_buffers(shapes: list[tuple[int, ...]]) -> list[torch.Tensor | None]:
    """A free kept buffer for each shape, the most recently used first (its pages are the
    likeliest still cached), or None; never one buffer for two outputs."""
    given: list[torch.Tensor | None] = []
    outputs = _kept_outputs()
    for shape in shapes:
        free = (kept for kept in reversed(outputs.get(shape, ()))
                if _is_free(kept) and all(kept is not g for g in given))
        given.append(next(free, None))
    return given


def _keep_outputs(outs: list[torch.Tensor]) -> None:
    """Keep the outputs as the most recently used buffers of their shapes."""
    outputs = _kept_outputs()
    if outs and any(shape[0] != outs[0].shape[0] for shape in outputs):
        outputs.clear()
    for out in outs:
        shape = tuple(out.shape)
        others = [k for k in outputs.get(shape, ()) if k.data_ptr() != out.data_ptr()]
        # A tensor of our own on the same storage (not the caller's object), so the use
        # count tells whether the caller, or anything it made, still holds the buffer.
        outputs[shape] = [*others[-(_KEPT_PER_SHAPE - 1):], out.detach()]


def lookup_many(weights, ids, offsets, num_fields, mean_pooled=None, max_len=None, into=None):
    shapes = [(offsets.numel() // num_fields, num_fields, weight.shape[1]) for weight in weights]
    buffers = _output_buffers(shapes)
    if into is not None:  # the caller's views (a model's flat input), written in place
        buffers = [given if given is not None else kept for given, kept in zip(into, buffers, strict=True)]
    outs = _ops.lookup_many(list(weights), ids.contiguous(), offsets.contiguous(), num_fields, _flags(mean_pooled),
                            _limits(max_len), buffers)
    _keep_outputs([out for i, out in enumerate(outs) if into is None or into[i] is None])
    return outs


def _bag_rows(grad: torch.Tensor) -> torch.Tensor:
    """The gradient as the update kernel reads it: float32 (samples, fields, dim) with each
    sample's bags side by side, at any sample stride (a view of the flat input's gradient
    is read in place); anything else is copied into that layout."""
    if grad.dtype == torch.float32 and grad.dim() == 3 and grad.stride(2) == 1 and grad.stride(1) == grad.size(2) \
            and grad.stride(0) >= grad.size(1) * grad.size(2):
        return grad
    return grad.contiguous().float()


def lookup(weight, ids, offsets, num_fields, mean_pooled=None, max_len=None):
    return lookup_many([weight], ids, offsets, num_fields, mean_pooled, max_len)[0]


def fused_update_many(weights, slots, ids, offsets, grads, num_fields, optimizers: list[SparseOptimizer], steps,
                      mean_pooled=None, max_len=None, field_rows=None, disjoint_fields=False):
    if field_rows is None:
        scratch, bounds = _scratch_for(weights[0].shape[0]), _NO_LIMITS
    else:
        scratch, bounds = _NO_SCRATCH, field_rows.to(torch.int64).contiguous()
    _ops.fused_update_many(
        list(weights), [list(s) for s in slots], ids.contiguous(), offsets.contiguous(),
        [_bag_rows(grad) for grad in grads], num_fields, [o.name for o in optimizers],
        [[o.lr, o.eps, o.beta1, o.beta2, o.weight_decay] for o in optimizers], [int(step) for step in steps],
        _flags(mean_pooled), _limits(max_len), bounds, scratch, disjoint_fields,
    )


def fused_update(weight, slots, ids, offsets, grad, num_fields, optimizer: SparseOptimizer, step,
                 mean_pooled=None, max_len=None, field_rows=None, disjoint_fields=False):
    fused_update_many([weight], [slots], ids, offsets, [grad], num_fields, [optimizer], [step], mean_pooled, max_len,
                      field_rows, disjoint_fields)


row_gradients = row_gradients_by_sgd_step(fused_update)


def map_to_slots(ids, slot_of_row, capacity):
    return tuple(_cache_ops.map_to_slots(ids.contiguous(), slot_of_row, capacity, _scratch_for(slot_of_row.numel())))


def positions_in(rows, among, num_rows):
    return _cache_ops.positions_in(rows.contiguous(), among.contiguous(), _scratch_for(num_rows))


def copy_rows(dst, dst_index, src, src_index):
    _cache_ops.copy_rows(dst, dst_index, src, src_index)


def sketch_add(counters, rows, counts, multipliers, bits):
    return _cache_ops.sketch_add(counters, rows, counts.to(torch.int64), multipliers.flatten(), bits)


# The id map's ops: id_map_reference.py's find, admit, expire and rebuild, over its tensors.
def id_map_find(index, row_keys, last_seen, counts, keys, batch: int, update: bool):
    return tuple(_id_map_ops.find(index, row_keys, last_seen, counts, keys.contiguous(), int(batch), bool(update)))


def id_map_admit(index, row_keys, last_seen, counts, free_rows, free_count, keys, key_counts, batch: int, lfu: bool,
                 protect_since: int):
    return tuple(_id_map_ops.admit(index, row_keys, last_seen, counts, free_rows, free_count, keys.contiguous(),
                                   key_counts.contiguous(), int(batch), bool(lfu), int(protect_since)))


def id_map_expire(index, row_keys, last_seen, counts, free_rows, free_count, older_than: int, keep: int):
    return tuple(_id_map_ops.expire(index, row_keys, last_seen, counts, free_rows, free_count, int(older_than),
                                    int(keep)))


def id_map_resolve(index, row_keys, last_seen, counts, free_rows, free_count, keys, now: int, expire_rows: bool,
                   older_than: int, keep: int, lfu: bool, protect_since: int, default_row: int, sketch_counters,
                   sketch_multipliers, sketch_bits: int, sketch_added, sketch_window: int, admit_after: float):
    return tuple(_id_map_ops.resolve(index, row_keys, last_seen, counts, free_rows, free_count, keys.contiguous(),
                                     int(now), bool(expire_rows), int(older_than), int(keep), bool(lfu),
                                     int(protect_since), int(default_row), sketch_counters,
                                     sketch_multipliers.flatten(), int(sketch_bits), sketch_added, int(sketch_window),
                                     float(admit_after)))


def id_map_rebuild(index, row_keys) -> None:
    _id_map_ops.rebuild(index, row_keys)


def id_map_initial_rows(keys, width: int, scale: float):
    return _id_map_ops.initial_rows(keys.contiguous(), int(width), float(scale))


def id_map_reset_rows(weight, slots, targets, keys, scale: float) -> None:
    _id_map_ops.reset_rows(weight, list(slots), targets.contiguous(), keys.contiguous(), float(scale))
