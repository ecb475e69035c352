"""All-to-all as a Pallas kernel: every device DMAs one chunk to every other.

What it shows: what ``lax.all_to_all(x, "i", split_axis=1, concat_axis=0,
tiled=True)`` does on the wire, written by hand as a Pallas TPU kernel.
Device ``d`` holds a row block ``[k, n*c]`` and cuts it into ``n`` column
chunks ``[k, c]``: it keeps chunk ``d`` (a local copy into slot ``d`` of its
output) and sends chunk ``j`` to device ``j`` with a remote DMA, straight
into slot ``d`` of device ``j``'s output. After the DMAs every device holds
the column block ``[n*k, c]``, slot ``s`` filled by device ``s``: the
global array is unchanged, its layout has gone from rows to columns.

How it synchronises:

  * a barrier with every device first (``get_barrier_semaphore`` with a
    ``collective_id``): each device writes into all the others, and may
    only once each has entered the kernel;
  * one destination slot and one receive semaphore per source
    (``SemaphoreType.DMA((n,))``, indexed by the sender): the ``n - 1``
    chunks arriving from different devices land in different places and
    count on different semaphores, so all ``n - 1`` sends can be in flight
    at once and a wait for device ``s``'s chunk is satisfied by device
    ``s``'s bytes alone;
  * the sends go out in the order ``d + 1, d + 2, ...`` (mod ``n``), each
    device starting with a different peer; then each device waits for every
    chunk it sends (``wait_send``, one send semaphore: all chunks are the
    same size) and every chunk it receives (``wait_recv`` on that source's
    semaphore), so every semaphore is back at 0 when the kernel ends.

Where it runs: on a TPU, Mosaic compiles the kernel. Anywhere else, Pallas's
TPU interpret mode (``interpret=pltpu.InterpretParams()``) runs it on the CPU,
simulating every device's memory, DMA engines and semaphores (one thread per
device), bit for bit what ``lax.all_to_all`` returns. Interpret mode needs
JAX 0.10.2 or newer here and ``PJRT_NPROC`` of at least twice the device
count (``main()`` sets it).

Which form when: use ``lax.all_to_all`` (or change the output sharding under
jit). Write the kernel to control the exact DMAs, or to overlap them with
compute in the same kernel (an MoE layer can start on the tokens that have
arrived). It costs ``n - 1`` DMAs per device, one ``[k, c]`` chunk each
(``1/n`` of the block), all in flight together. The jit and explicit forms
below are the global program XLA partitions (what the kernel is compared
with), as in ``all_to_all.py``: the explicit form reuses the jit form's
program, with no kernel in it, and compiles to XLA's all-to-all.

The kernel, the global programs and the NumPy oracle below are the ones
``collectives.RECIPES["kernel_all_to_all"]`` runs (one mesh axis; on a 2-D
mesh, along that axis, the other axis's devices exchanging among
themselves).

Registered as: ``collectives.RECIPES["kernel_all_to_all"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.10.2, 0.12.0.1 (interpret mode needs 0.10.2 or newer).
Run: ``python recipes/kernel_all_to_all.py``
"""

import os

import jax
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8
AXIS = "i"


def make_explicit_mesh(n_devices):
    # jax.make_mesh's default from JAX 0.9 on, spelled out for every version.
    return jax.make_mesh((n_devices,), (AXIS,),
                         axis_types=(jax.sharding.AxisType.Explicit,))


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), (AXIS,),
                         axis_types=(jax.sharding.AxisType.Auto,))


def interpret_mode():
    # A TPU compiles the kernel; elsewhere interpret mode simulates the TPU.
    return False if jax.default_backend() == "tpu" else pltpu.InterpretParams()


# [start:body]
def all_barrier(axis, me, n):
    # Signal every other device, wait for all of them: each has entered the
    # kernel, so its output exists and DMAs into it are safe. (Needs a
    # collective_id.)
    barrier = pltpu.get_barrier_semaphore()

    def signal(s, carry):
        pl.semaphore_signal(barrier, 1, device_id={axis: lax.rem(me + s, n)})
        return carry

    lax.fori_loop(1, n, signal, 0)
    pl.semaphore_wait(barrier, n - 1)


def kernel_all_to_all_body(x, axis=AXIS):
    # x: [k, n*c, ...] on each device (a row block) -> [n*k, c, ...] (a
    # column block): chunk j of device d's columns lands in rows d*k.. of
    # device j
    n = lax.axis_size(axis)
    k, width, *rest = x.shape
    if width % n:
        raise ValueError(
            f"x: a block of {width} columns does not split into {n} equal chunks "
            f"(one per device along {axis!r}). Fix: make dim 1 a multiple of {n}.")
    c = width // n

    def kernel(x_ref, out_ref, copy_sem, send_sem, recv_sems):
        me = lax.axis_index(axis)

        def chunk(j):  # columns j*c .. (j+1)*c of our block: device j's
            return x_ref.at[:, pl.ds(j * c, c)]

        def dma(src, dst):  # src's chunk dst, into slot src of dst's output
            return pltpu.make_async_remote_copy(
                chunk(dst), out_ref.at[src], send_sem, recv_sems.at[src],
                device_id={axis: dst})

        if n > 1:
            all_barrier(axis, me, n)
        own = pltpu.make_async_copy(chunk(me), out_ref.at[me], copy_sem)
        own.start()

        def send(s, carry):  # step s: our chunk for the device s places on
            dma(me, lax.rem(me + s, n)).start()
            return carry

        def wait(s, carry):
            dma(me, lax.rem(me + s, n)).wait_send()  # our chunk has left
            # the chunk of the device s places back has landed in its slot
            dma(lax.rem(me + n - s, n), me).wait_recv()
            return carry

        lax.fori_loop(1, n, send, 0)
        own.wait()
        lax.fori_loop(1, n, wait, 0)

    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((n, k, c, *rest), x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA,
                        pltpu.SemaphoreType.DMA((n,))],
        compiler_params=pltpu.CompilerParams(collective_id=0),
        interpret=interpret_mode(),
    )(x)
    return out.reshape(n * k, c, *rest)


# [end:body]


# [start:pmap]
# No pmap form: the kernel addresses its peers by mesh coordinates
# (device_id={axis: peer}), which only shard_map gives it. Legacy pmap code
# calls lax.all_to_all (all_to_all.py shows it).
# [end:pmap]


# [start:shard_map]
def kernel_all_to_all_shard_map(x, mesh):
    # rows -> columns: in_specs row blocks, out_specs column blocks
    f = jax.shard_map(kernel_all_to_all_body, mesh=mesh, in_specs=P(AXIS, None),
                      out_specs=P(None, AXIS), check_vma=False)
    return jax.jit(f)(x)


def lax_all_to_all_shard_map(x, mesh):
    # What the kernel implements, for comparison: lax.all_to_all.
    f = jax.shard_map(
        lambda b: lax.all_to_all(b, AXIS, split_axis=1, concat_axis=0, tiled=True),
        mesh=mesh, in_specs=P(AXIS, None), out_specs=P(None, AXIS))
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def all_to_all_program(x):
    # The identity program: only the layout changes, rows -> columns.
    return x


def all_to_all_jit(x, mesh):
    f = jax.jit(all_to_all_program, in_shardings=NamedSharding(mesh, P(AXIS, None)),
                out_shardings=NamedSharding(mesh, P(None, AXIS)))
    return f(x)
# [end:jit]


# [start:explicit]
def all_to_all_explicit_program(x):
    # x: f32[n*k@i, n*c]: the jit form's program (x itself), no kernel, with
    # its split moved from rows to columns in the type: XLA's all-to-all
    rows, _, *rest = tuple(jax.typeof(x).sharding.spec) + (None,) * x.ndim
    return jax.sharding.reshard(all_to_all_program(x),
                                P(None, rows, *rest[:x.ndim - 2]))


def all_to_all_explicit(x, n_devices):
    mesh = make_explicit_mesh(n_devices)
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P(AXIS, None))  # float32[2048@i,1024]
        return jax.jit(all_to_all_explicit_program)(x)  # float32[2048,1024@i]
# [end:explicit]


# [start:numpy]
def all_to_all_numpy(x):
    return np.array(x)  # a copy: the same values, a new layout
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform; threads for interpret mode to wait on every device.
    os.environ.setdefault("PJRT_NPROC", str(2 * N_DEVICES))
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    if jax.__version_info__[:3] < (0, 10, 2):
        print(f"skipped: the kernel needs JAX 0.10.2 or newer for interpret mode "
              f"(this is {jax.__version__})")
        print("ok: nothing to compare on this JAX")
        return
    mesh = make_mesh(N_DEVICES)
    # 1 MiB per device: [256, 1024] float32 row blocks, sent as 8 chunks of
    # [256, 128] (128 KiB); each device ends with a [2048, 128] column block.
    x = np.arange(N_DEVICES * 256 * 1024, dtype=np.float32).reshape(-1, 1024)
    want = all_to_all_numpy(x)
    results = {
        "shard_map (the kernel)": kernel_all_to_all_shard_map(x, mesh),
        "shard_map (lax.all_to_all)": lax_all_to_all_shard_map(x, mesh),
        "jit": all_to_all_jit(x, mesh),
        "explicit": all_to_all_explicit(x, N_DEVICES),
    }
    for form, got in results.items():
        np.testing.assert_array_equal(np.asarray(got), want,
                                      err_msg=f"kernel_all_to_all ({form} form)")
    moved = results["shard_map (the kernel)"]
    assert moved.sharding.spec == P(None, AXIS), moved.sharding
    device_1 = np.asarray(moved.addressable_shards[1].data)  # its column block
    np.testing.assert_array_equal(device_1, x[:, 128:256])
    print(f"x: float32{list(x.shape)}, a [256, 1024] row block (1 MiB) on each of "
          f"{N_DEVICES} devices")
    print(f"the kernel: {N_DEVICES - 1} remote DMAs per device, one [256, 128] "
          f"chunk (128 KiB) each, plus one local copy")
    print(f"device 1 now holds columns 128..255; row 256 starts "
          f"{device_1[256, :3].tolist()} (= x[256, 128:131], from device 1's rows)")
    print("ok: the kernel, lax.all_to_all, jit and explicit agree with NumPy "
          "bit for bit")


if __name__ == "__main__":
    main()
