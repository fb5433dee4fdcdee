"""Atomic reads and adds on int64 array slots, for numba kernels that share work between
threads without the GIL (``bm25_kernels.claimed_top_rows``).

numba has no atomics of its own; these emit LLVM's ``atomicrmw`` and atomic ``load``
(sequentially consistent), so a slot written by one thread is seen by the others in order,
and a load in a loop is read again every time instead of hoisted out of it.
"""

from __future__ import annotations

from typing import Any

from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


def _slot_pointer(context: Any, builder: Any, array_type: Any, array: Any, index: Any) -> Any:
    ary = context.make_array(array_type)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, array_type, ary, [index])


@intrinsic
def atomic_add(typingctx: Any, array: Any, index: Any, value: Any) -> Any:
    """``array[index] += value`` atomically (int64 array); returns the value before."""
    if not (isinstance(array, types.Array) and array.dtype == types.int64):
        return None
    signature = types.int64(array, types.intp, types.int64)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        pointer = _slot_pointer(context, builder, sig.args[0], args[0], args[1])
        return builder.atomic_rmw("add", pointer, args[2], "seq_cst")

    return signature, codegen


@intrinsic
def atomic_load(typingctx: Any, array: Any, index: Any) -> Any:
    """``array[index]`` read atomically (int64 array)."""
    if not (isinstance(array, types.Array) and array.dtype == types.int64):
        return None
    signature = types.int64(array, types.intp)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        pointer = _slot_pointer(context, builder, sig.args[0], args[0], args[1])
        return builder.load_atomic(pointer, "seq_cst", 8)

    return signature, codegen


@njit(nogil=True, cache=True)
def wait_for(slots, index, target, spins):  # pragma: no cover - compiled
    """Whether ``slots[index]`` reached ``target`` within ``spins`` reads, without the GIL.

    For waits of microseconds, where a sleeping thread's wake-up (a futex, then the GIL)
    would cost more than the wait: the caller falls back to a blocking wait when it fails."""
    for _ in range(spins):
        if atomic_load(slots, index) >= target:
            return True
    return False
