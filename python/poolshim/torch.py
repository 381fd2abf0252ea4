"""poolshim.torch: PyTorch's allocations served by poolshim, with one line.

    import poolshim.torch
    poolshim.torch.enable()        # before the first CUDA tensor

PyTorch's allocator is replaced by a ``torch.cuda.memory.CUDAPluggableAllocator`` over
libpoolshim.so's torch door (shim/hooks_torch.c): every tensor is served by the device's
pool as a cudaMalloc would be, and freed as by cudaFree, its reuse ordered by the pool's
barrier after the work issued before the free on the legacy stream, the blocking streams
and every stream PyTorch named to the door (allocated on, or given to
``Tensor.record_stream``). No LD_PRELOAD is needed, nor PyTorch's cache off; with the
library preloaded as well, the same stacks serve both.

The library's configuration (POOLSHIM_CONFIG, POOLSHIM_OPTIONS, the INI stacks),
statistics (POOLSHIM_STATS, ``poolshim.stats_now()``) and live view (``poolshim
top``) work as under LD_PRELOAD: the door goes through the same router and stacks.

What PyTorch does not offer an external allocator: ``torch.cuda.memory_allocated()``
and the other statistics of PyTorch's own allocator raise; read poolshim's instead.
CUDA graphs captured with PyTorch's graph pools are not served by the door.
"""
import ctypes
import os

__all__ = ["enable", "enabled", "library"]

_state = {"allocator": None, "library": None}


def _default_library():
    env = os.environ.get("POOLSHIM_LIBRARY")
    if env:
        return env
    from . import library_path
    return library_path()


def enable(library=None):
    """Installs poolshim as PyTorch's CUDA allocator; returns the allocator object.

    `library`: the libpoolshim.so to use (default: $POOLSHIM_LIBRARY, else the one in
    this package). Must run before PyTorch allocates its first CUDA tensor: PyTorch
    refuses to swap an allocator it has used (RuntimeError). Calling it again with
    the same library does nothing."""
    import torch
    path = os.path.abspath(library or _default_library())
    if _state["allocator"] is not None:
        if _state["library"] != path:
            raise RuntimeError("poolshim.torch: already enabled with %s" % _state["library"])
        return _state["allocator"]
    if not os.path.isfile(path):
        raise FileNotFoundError("poolshim.torch: no library at %s" % path)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "poolshim_torch_alloc", "poolshim_torch_free")
    lib = ctypes.CDLL(path)
    record = ctypes.cast(lib.poolshim_torch_record_stream, ctypes.c_void_p).value
    setter = getattr(allocator._allocator, "set_record_stream_fn", None)
    if setter is None:
        raise RuntimeError("poolshim.torch: this PyTorch (%s) cannot pass record_stream to an external "
                           "allocator; use LD_PRELOAD with PYTORCH_NO_CUDA_MEMORY_CACHING=1" % torch.__version__)
    setter(record)
    torch.cuda.memory.change_current_allocator(allocator)
    _state["allocator"], _state["library"] = allocator, path
    return allocator


def enabled():
    """Whether enable() installed poolshim in this process."""
    return _state["allocator"] is not None


def library():
    """The path of the library enable() installed, or None."""
    return _state["library"]
