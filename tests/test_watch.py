"""The peer watch's view of a rank: where its main thread is, and whether it
is idle (collectives/distributed/_watch.py); the verdicts it leads to are
tested under every launcher in test_launchers.py."""

import ast
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from collectives.distributed import _watch


def test_a_stack_read_while_the_thread_runs_is_a_place_or_unknown_never_an_error():
    # This thread keeps calling and returning (frames come and go) while
    # another reads its stack, as the heartbeat reads the main thread's.
    # (This thread, not the main one: xdist may run tests off the main one.)
    main = threading.get_ident()
    seen, errors, stop = [], [], threading.Event()

    def read():
        while not stop.is_set():
            try:
                seen.append(_watch._where(main))
            except Exception as err:  # recorded, asserted below
                errors.append(err)
            time.sleep(0.0005)  # a thousand reads a second, the thread runs between

    def deep(n):
        return 0 if n == 0 else 1 + deep(n - 1)

    reader = threading.Thread(target=read)
    reader.start()
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        deep(50)
    stop.set()
    reader.join()
    assert not errors, errors[:3]
    assert seen and all(w is None or (isinstance(w[0], bool) and isinstance(w[1], str))
                        for w in seen)
    assert any(w is not None and "test_watch.py" in w[1] for w in seen), seen[:5]


def test_a_thread_inside_jax_reads_as_inside_and_names_the_caller():
    done = threading.Event()
    where = []
    caller = threading.get_ident()

    def sample():
        time.sleep(0.05)
        while not done.is_set():
            where.append(_watch._where(caller))
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        jax.jit(lambda x: x + 1)(jnp.ones(3))  # traced and dispatched in jax
    done.set()
    sampler.join()
    inside = [w for w in where if w is not None and w[0]]
    assert inside, where[:5]
    # (jax may import a module on the way: importlib's frames sit between)
    assert any("test_watch.py" in place for _, place in inside), inside[:5]



class _Touchy:
    @property
    def step(self):  # reading it would run code: the watch never does
        raise AssertionError("the watch evaluated a property")


def test_a_line_waits_inside_jax_where_its_call_is_jaxs_or_takes_a_jax_array():
    # a rank blocked in `y = step(x)` or `np.asarray(out)` has no JAX frame
    # on its stack (jit's fast path and the array's value are C++): the
    # call's own callee and arguments say it waits inside JAX
    step = jax.jit(lambda a: a + 1)
    out = step(jnp.ones(3))
    touchy, plain = _Touchy(), np.ones(3)
    frame = sys._getframe()  # the lines below are read in this frame
    named = {"step": step, "out": out, "touchy": touchy, "plain": plain}
    assert all(frame.f_locals[name] is value for name, value in named.items())

    def said(source):
        return _watch.jax_in_call(ast.parse(source, mode="eval").body, frame)

    assert said("step(plain)") == "step()"
    assert said("jax.jit(print)(plain)") is None  # a call's result is not looked up
    assert said("np.asarray(out)") == "np.asarray() of out"
    assert said("print(out.sum(), sep=out[0])") == "print() of out"
    assert said("np.asarray(plain)") is None
    assert said("time.sleep(0.1)") is None
    assert said("touchy.step(plain)") is None  # another object's attribute
    assert said("undefined_name(plain)") is None
