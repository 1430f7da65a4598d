"""What one process shares across its llama.cpp contexts: weights, one compute thread, the log.

- :class:`Weights`: a loaded GGUF model. Every context of the process on the same file (the
  serving context, the semantic tier's judge, another engine) reads the same ``llama_model``;
  it is freed when the last context holding it closes, whichever closes first.
- :func:`on_compute_thread`: every ``llama_decode`` of the process runs on one thread.
- :func:`install_log_route`: llama.cpp's log goes to Python logging.
- :func:`build_id`: which llama.cpp build the process runs (a KV snapshot is loaded only into
  the build that wrote it).
- :func:`repack_off`: models that llama-cpp-python's own ``Llama`` loads (the peers the
  benchmarks and tests run against) load without weight repacking, as ours do;
  :func:`llama_cpp_server_argv` starts its server that way.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar, TypeVar

import llama_cpp

from continuum.errors import BackendError

_llama_log = logging.getLogger("continuum.llama_cpp")
_LEVELS = {4: logging.WARNING}  # llama.cpp errors; its info and warnings are debug detail


@llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
def _route_llama_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp's own log goes to Python logging, never straight to stdout/stderr
    _llama_log.log(
        _LEVELS.get(level, logging.DEBUG), "%s", text.decode("utf-8", "replace").rstrip()
    )


def install_log_route() -> None:
    llama_cpp.llama_log_set(_route_llama_log, ctypes.c_void_p(0))


def _c_text(name: str, *args: int) -> str:
    """A ``const char *`` that libllama (or the ggml it links) returns; "unknown" for a symbol
    this build lacks."""
    try:
        fn = llama_cpp.llama_cpp._lib[name]  # a fresh function object: no shared restype set
    except (AttributeError, KeyError):
        return "unknown"
    fn.argtypes = [ctypes.c_int] * len(args)
    fn.restype = ctypes.c_char_p
    raw = fn(*args)
    return raw.decode("utf-8", "replace") if raw else "unknown"


@functools.cache
def build_id() -> str:
    """What identifies the llama.cpp build this process runs, as one string: the
    llama-cpp-python release, the commit and version of the ggml/llama.cpp sources it was built
    from, libllama's version, and a digest of the compiled-in features
    (``llama_print_system_info``: CPU kernels, GPU backends). The state bytes of a KV cache are
    only promised to load into, and give the same logits in, the build that wrote them, so a
    snapshot from any other build is refused and the session is rebuilt (DESIGN.md §3.3)."""
    features = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
    return (
        f"llama-cpp-python {llama_cpp.__version__}; llama.cpp {_c_text('ggml_commit')} "
        f"(ggml {_c_text('ggml_version')}, libllama {_c_text('llama_version')}); "
        f"features {hashlib.blake2b(features.encode(), digest_size=6).hexdigest()}"
    )


def ggml_type_name(ggml_type: int) -> str:
    """The name of a ggml tensor type (``f16``, ``q8_0``, ...), as a KV cache type is reported."""
    return _c_text("ggml_type_name", ggml_type)


_T = TypeVar("_T")
_compute: ThreadPoolExecutor | None = None
_compute_ident: int | None = None
_compute_lock = threading.Lock()


def on_compute_thread(fn: Callable[[], _T]) -> _T:
    """Run ``fn`` on the process's one llama.cpp compute thread and return its result.

    Every ``llama_decode`` in the process goes through here. ggml's CPU backend keeps an
    OpenMP thread team per calling thread, and while a second team is alive every decode is
    about 2x slower on a machine with no spare cores (measured here: 12 tokens in 31 ms from
    one thread, 60 ms once a second thread had decoded too, until that thread exits). A
    server calls in from many request threads and the idle-glue runner from its own; the hop
    costs ~0.05 ms. Code that drives llama.cpp some other way in the same process (a
    benchmark's llama-cpp-python peer) should run its calls through here as well."""
    global _compute, _compute_ident
    if _compute is None:
        with _compute_lock:
            if _compute is None:
                pool = ThreadPoolExecutor(1, thread_name_prefix="continuum-llama-compute")
                _compute_ident = pool.submit(threading.get_ident).result()
                _compute = pool
    if threading.get_ident() == _compute_ident:
        return fn()
    return _compute.submit(fn).result()


def compute_thread_ident() -> int | None:
    """The compute thread's ident once it exists (tests)."""
    return _compute_ident


@contextlib.contextmanager
def repack_off() -> Iterator[None]:
    """Inside this block, every model llama-cpp-python's ``Llama`` loads is loaded without
    weight repacking.

    ``Llama`` has no parameter for it and repacks by default; on CPUs with AMX the repacked
    matrix kernels crash the process in ``llama_decode`` (a segfault, seen on this project's
    CI machines). ``Llama`` reads its defaults through ``llama_cpp.llama_cpp`` at construction,
    so the defaults are swapped for the block's length.
    """
    module = llama_cpp.llama_cpp
    original = module.llama_model_default_params

    def unrepacked() -> llama_cpp.llama_model_params:
        params: llama_cpp.llama_model_params = original()
        params.use_extra_bufts = False
        return params

    module.llama_model_default_params = unrepacked
    try:
        yield
    finally:
        module.llama_model_default_params = original


def llama_cpp_server_argv() -> list[str]:
    """The command that starts llama-cpp-python's own server (``python -m llama_cpp.server``,
    the peer of benchmarks and tests) with its models loaded under :func:`repack_off`; its
    flags follow."""
    code = (
        "import runpy\n"
        "from continuum.backends.llama_process import repack_off\n"
        "with repack_off():\n"
        "    runpy.run_module('llama_cpp.server', run_name='__main__')\n"
    )
    return [sys.executable, "-c", code]


class Weights:
    """One ``llama_model`` and the number of contexts holding it (freed at zero).

    :meth:`open` gives every context of the process that opens the same file the same loaded
    weights (llama.cpp reads a model from any number of contexts); within :meth:`retained`,
    weights no context holds stay loaded for the next one to open them."""

    _live: ClassVar[dict[tuple[Path, int, int], Weights]] = {}  # (path, mtime_ns, size)
    _lock: ClassVar[threading.Lock] = threading.Lock()  # the registry and every holder count
    _retaining: ClassVar[int] = 0  # retained() blocks open now

    def __init__(self, path: Path) -> None:
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        # No weight repacking: with it, the same prompt decoded in different chunkings gives
        # logits that differ by up to ~0.9; without it every chunk of >= 8 tokens is bit-equal
        # to one full batch, at the same speed here (measured: 560 vs 547 prompt tokens/s).
        params.use_extra_bufts = False
        self.path = path
        self.ptr = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.ptr:
            raise BackendError(
                f"llama.cpp could not load {path}: check it is a model this llama.cpp "
                "supports and that there is enough memory"
            )
        self._holders = 1
        self._key: tuple[Path, int, int] | None = None  # its entry in _live, if any

    @classmethod
    def open(cls, path: Path) -> Weights:
        """The weights of ``path`` with one more holder: the ones loaded in this process if any
        (the same file, unchanged since), else newly loaded."""
        try:
            st = path.stat()
        except OSError as e:
            raise BackendError(
                f"no model file at {path} ({e.strerror}): give an existing GGUF path or an "
                "alias (continuum info lists the model in use)"
            ) from None
        key = (path.resolve(), st.st_mtime_ns, st.st_size)
        with cls._lock:
            live = cls._live.get(key)
            if live is not None:
                live._holders += 1
                return live
        loaded = cls(path)  # seconds: outside the lock (two first openers may both load)
        with cls._lock:
            if key not in cls._live:
                loaded._key = key
                cls._live[key] = loaded
        return loaded

    @classmethod
    @contextlib.contextmanager
    def retained(cls) -> Iterator[None]:
        """Weights that no context holds stay loaded inside this block, for the next context
        to open them (a test session or a benchmark that opens one engine after another);
        at its end the ones nobody holds are freed."""
        with cls._lock:
            cls._retaining += 1
        try:
            yield
        finally:
            with cls._lock:
                cls._retaining -= 1
                idle = [] if cls._retaining else [w for w in cls._live.values() if not w._holders]
                for w in idle:
                    w._forget()
            for w in idle:
                llama_cpp.llama_model_free(w.ptr)

    def acquire(self) -> Weights:
        with self._lock:
            if self._holders == 0 and self._key not in self._live:
                raise BackendError(f"the weights of {self.path} were freed already")
            self._holders += 1
        return self

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            last = self._holders == 0 and (not self._retaining or self._key is None)
            if last:
                self._forget()
        if last:
            llama_cpp.llama_model_free(self.ptr)

    def _forget(self) -> None:  # under _lock
        if self._key is not None and self._live.get(self._key) is self:
            del self._live[self._key]
        self._key = None
