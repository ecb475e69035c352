"""What the kernel recipes need around them: where they run, and a bound on
how long a call may take.

The kernel recipes (``family="kernel"``, ``recipes/kernel_*.py``) write a
collective as a Pallas TPU kernel of remote DMAs and semaphores. On a TPU
Mosaic compiles them; on CPU devices Pallas's TPU interpret mode runs them,
simulating each device's memory, its DMA engines and its semaphores with one
thread per device. Two things follow, and this module holds both:

* where they run (:func:`form_reason`): under ``jax.shard_map`` only (a
  kernel addresses its peers by mesh coordinates), over one mesh axis, in one
  process (interpret mode's memory is a Python object), on CPU or TPU
  devices, from JAX 0.10.2;
* how long a call may take (:class:`Bounded`): a kernel that waits for a
  signal nobody sends waits forever, and so does interpret mode when XLA:CPU
  runs out of threads for the simulated devices. A call that outlives its
  limit fails every simulated device
  (:func:`collectives._compat.stop_interpreted_kernels`) and raises
  :class:`KernelTimeout`, naming the causes and their fixes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import jax

from collectives import _compat
from collectives._layout import Axes

LIMIT_ENV = "COLLECTIVES_KERNEL_TIMEOUT"
"""The environment variable that sets :data:`DEFAULT_LIMIT_S` (seconds)."""

DEFAULT_LIMIT_S = 300.0
"""How long one call of a kernel form may run before it is stopped, unless
``$COLLECTIVES_KERNEL_TIMEOUT`` says otherwise. A kernel of 1 MiB per device
takes about a second under interpret mode on two cores; five minutes leaves
room for a loaded machine."""


def current_limit_s() -> float:
    """The limit in force: ``$COLLECTIVES_KERNEL_TIMEOUT`` or the default."""
    text = os.environ.get(LIMIT_ENV, "").strip()
    try:
        return float(text) if text else DEFAULT_LIMIT_S
    except ValueError:
        raise ValueError(
            f"${LIMIT_ENV}={text!r}: expected seconds, such as 60. Fix: set a "
            "number or unset it.") from None

THREADS_PER_DEVICE = 2
"""``PJRT_NPROC`` per simulated device that :func:`collectives.use_cpu_devices`
sets where it is unset: XLA:CPU's thread pool has ``max(cores, devices)``
threads, interpret mode holds one per device while it waits, and with exactly
one each a kernel of more than about 100 KiB per device never finishes."""


class KernelTimeout(TimeoutError):
    """A kernel form ran past its limit and was stopped."""


def form_reason(form: str, axes: Axes) -> str | None:
    """Why ``form`` does not run a kernel recipe on ``axes`` here, or None.

    The jit and explicit forms run the ``lax`` collective's global program
    (what XLA makes of it), the shard_map form runs the kernel."""
    if form == "pmap":
        return ("a Pallas kernel addresses its peers by mesh coordinates, which "
                "only jax.shard_map gives it; pmap (and the vmap it nests over "
                "further mesh axes) does not run remote DMAs")
    if form != "shard_map":
        return None
    if not _compat.HAS_INTERPRET_KERNELS:
        return (f"needs JAX 0.10.2 or newer (this is {jax.__version__}): before, "
                "interpret mode could leave every device waiting forever after "
                "one failed, and before 0.10.0 a remote DMA out of a kernel's "
                "output failed (KeyError ('any', ...))")
    if jax.process_count() > 1:
        return ("interpret mode simulates the devices of one process; remote DMAs "
                "between processes need TPUs")
    platforms = {device.platform for device in axes.mesh.devices.flat}
    if not platforms <= {"cpu", "tpu"}:
        return (f"a Pallas TPU kernel runs on TPUs, or in interpret mode on CPU "
                f"devices; this mesh's devices are {', '.join(sorted(platforms))}")
    return None


def one_axis(axes: Axes) -> str | None:
    """The kernels run a ring along one mesh axis."""
    if len(axes.names) != 1:
        return (f"runs along one mesh axis, got {axes.names}. Fix: pass "
                "axis=<one mesh axis name>")
    return None


def cpu_threads_for(n_devices: int) -> None:
    """Give XLA:CPU enough threads for ``n_devices`` simulated devices to
    wait at once (``PJRT_NPROC``, read when the CPU backend starts), unless
    the environment already sets it."""
    if "PJRT_NPROC" not in os.environ:
        os.environ["PJRT_NPROC"] = str(max(os.cpu_count() or 1,
                                           THREADS_PER_DEVICE * n_devices))


def _timeout_message(name: str, limit_s: float, wedged: bool = False) -> str:
    threads = os.environ.get("PJRT_NPROC", "unset")
    if wedged:
        return (
            f"{name}: the kernel was still running after {limit_s:g} s, and "
            "stopping it did not free XLA:CPU's threads: they all wait inside "
            "the kernel's simulated devices, so nothing more can run in this "
            f"process. Too few threads (PJRT_NPROC is {threads}). Fix: set "
            f"PJRT_NPROC to at least {THREADS_PER_DEVICE} x the device count "
            "before JAX starts, or call collectives.use_cpu_devices(n), which "
            "does.")
    return (
        f"{name}: the kernel was still running after {limit_s:g} s and was "
        "stopped. A kernel that waits for a signal or for bytes nobody sends "
        "(a missing signal, a wait for more than arrives, a dropped DMA) waits "
        "forever; so does interpret mode when XLA:CPU has too few threads for "
        f"the simulated devices (PJRT_NPROC is {threads}). Fix: check that "
        "every wait has a matching signal or DMA; set PJRT_NPROC to at least "
        f"{THREADS_PER_DEVICE} x the device count before JAX starts (or call "
        f"collectives.use_cpu_devices(n), which does); or raise the limit with "
        f"${LIMIT_ENV}. Interpret mode's state was reset.")


_WEDGED: list[KernelTimeout] = []
"""The timeout of a stopped kernel whose thread never returned (see
:func:`wedged`)."""


def wedged() -> KernelTimeout | None:
    """The :class:`KernelTimeout` of a stopped kernel that still holds
    XLA:CPU's threads, or None.

    With fewer XLA:CPU threads than the simulated devices need (a small
    ``PJRT_NPROC``), every thread can end up inside interpret mode's
    callbacks, each waiting for work only a free thread could do. Stopping
    the kernel cannot free them: nothing more runs on the CPU devices in
    this process, and Python's own exit would abort in those threads, so
    the process ends with :func:`exit_now_if_wedged` instead."""
    return _WEDGED[0] if _WEDGED else None


def exit_now_if_wedged(code: int) -> int:
    """``code``, or, where a stopped kernel still holds XLA:CPU's threads
    (:func:`wedged`), end the process now with ``code`` (at least 1):
    Python's clean-up would abort in those threads (``terminate called
    after throwing an instance of ''``, exit 134)."""
    if wedged() is None:
        return code
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code or 1)


class _StoppedKernelLogs(logging.Filter):
    """Drops JAX's log record (with traceback) for each callback of a kernel
    this module stopped: every simulated device logs one, saying only that
    the kernel was stopped, which the KernelTimeout already says."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        while error is not None:
            if "KernelTimeout" in str(error):
                return False
            error = error.__context__
        return True


_CALLBACK_LOGGER = "jax._src.callback"


def _quiet_stopped_kernels() -> None:
    logger = logging.getLogger(_CALLBACK_LOGGER)
    if not any(isinstance(f, _StoppedKernelLogs) for f in logger.filters):
        logger.addFilter(_StoppedKernelLogs())


def call_bounded(fn: Callable[[], Any], name: str,
                 limit_s: float | None = None) -> Any:
    """``fn()`` (which runs an interpreted kernel and blocks until its result
    is ready) in a worker thread, stopped after ``limit_s`` seconds.

    JAX's configuration contexts are thread-local: ``fn`` runs with the
    caller's TPU interpret mode (``pltpu.force_tpu_interpret_mode``) and
    must enter any other it needs itself (a mesh).

    Raises:
      KernelTimeout: ``fn`` ran past the limit; every simulated device was
        failed, and interpret mode's state reset. Where that could not free
        the worker (:func:`wedged`), its message says so.
      Exception: whatever ``fn`` raised (interpret mode's state is reset
        after any failure, as it requires).
    """
    if wedged() is not None:
        raise KernelTimeout(f"{name}: not run: {wedged()}")
    limit = current_limit_s() if limit_s is None else limit_s
    params = _compat.interpret_mode_in_force()
    done: dict[str, Any] = {}

    def work() -> None:
        try:
            with _compat.forced_interpret_mode(params):
                done["value"] = jax.block_until_ready(fn())
        except BaseException as err:  # handed to the caller's thread
            done["error"] = err

    worker = threading.Thread(target=work, name=f"{name} (interpreted)", daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        error = KernelTimeout(_timeout_message(name, limit))
        _quiet_stopped_kernels()
        if _compat.stop_interpreted_kernels(error):
            worker.join(10)
            if worker.is_alive():  # devices wait at clean-up for one never started
                _compat.break_interpret_cleanup()
                worker.join(10)
        if worker.is_alive():  # every XLA:CPU thread is stuck in the kernel
            error = KernelTimeout(_timeout_message(name, limit, wedged=True))
            _WEDGED.append(error)
            raise error
        _compat.reset_interpret()
        raise error
    if "error" in done:
        _compat.reset_interpret()
        raise done["error"]
    return done["value"]


class Bounded:
    """A kernel form's compiled callable whose calls are bounded in time
    (:func:`call_bounded`); traced inside a caller's ``jax.jit``, or lowered,
    it is the callable itself."""

    def __init__(self, fn: Any, name: str) -> None:
        self._fn, self._name = fn, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _compat.tracing():
            return self._fn(*args, **kwargs)
        return call_bounded(lambda: self._fn(*args, **kwargs), self._name)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn.lower(*args, **kwargs)
