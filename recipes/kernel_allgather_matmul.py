"""A collective matmul as a Pallas kernel: the all-gather's DMAs overlap the matmuls.

What it shows: ``lax.all_gather(x, "i", tiled=True) @ w`` (x's rows sharded,
w's columns sharded) computed without waiting for the whole gather. Each
device holds one block of x's rows. At every ring step it starts the remote
DMA that sends the block it holds on to its right neighbour, and while the
DMA is in flight multiplies that same block with its columns of w, writing
the result's rows for that block. After ``n`` steps (``n - 1`` DMAs) it has
every row of ``x @ w`` for its columns, and the DMAs have hidden behind the
matmuls: the overlap ``collective_matmul.py`` builds from ``ppermute``
steps, here with the DMAs and their semaphores in plain view.

How it synchronises, as ``kernel_all_gather.py``: a barrier with both
neighbours first (a device may write into a neighbour only once it is in
the kernel), then one receive semaphore per ring step and one slot per
block in a gather buffer, so no DMA overwrites a block before it has been
multiplied. Each block is copied into a VMEM tile before the matmul (on a
TPU the vector units read VMEM; the gather buffer stays in HBM, ``pl.ANY``).

Where it runs: on a TPU, Mosaic compiles it; elsewhere Pallas's TPU
interpret mode runs it on the CPU (JAX 0.10.2 or newer; ``PJRT_NPROC`` of at
least twice the devices, which ``main()`` sets). Blocks must fit in VMEM on
a TPU (tens of MiB): bigger matmuls tile the rows and columns further.

Which form when: ``allgather_matmul_overlapped`` (collective_matmul.py) lets
XLA schedule the ring; write the kernel where you need the exact schedule,
or fuse more work into it. The jit and explicit forms are the global
``x @ w`` XLA partitions with an all-gather (what the kernel is compared with).

The kernel, the global programs and the NumPy oracle below are the ones
``collectives.RECIPES["kernel_allgather_matmul"]`` runs (one mesh axis).

Registered as: ``collectives.RECIPES["kernel_allgather_matmul"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.10.2, 0.12.0.1 (interpret mode needs 0.10.2 or newer).
Run: ``python recipes/kernel_allgather_matmul.py``
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8
AXIS = "i"


def make_mesh(n_devices, axis_type=jax.sharding.AxisType.Auto):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), (AXIS,), axis_types=(axis_type,))


def interpret_mode():
    # A TPU compiles the kernel; elsewhere interpret mode simulates the TPU.
    return False if jax.default_backend() == "tpu" else pltpu.InterpretParams()


# [start:body]
def neighbour_barrier(axis, left, right):
    # Signal both neighbours, wait for both: each has entered the kernel, so
    # its buffers exist and DMAs into them are safe. (Needs a collective_id.)
    barrier = pltpu.get_barrier_semaphore()
    for peer in (left, right):
        pl.semaphore_signal(barrier, 1, device_id={axis: peer})
    pl.semaphore_wait(barrier, 2)


def kernel_allgather_matmul_body(x, w, axis=AXIS):
    # x: [m, K] (rows of device me), w: [K, c] (its columns) -> [n*m, c]
    n, m = lax.axis_size(axis), x.shape[0]
    out_dtype = jnp.result_type(x.dtype, w.dtype)

    def kernel(x_ref, w_ref, out_ref, gathered, tile, copy_sem, send_sem, recv_sems):
        me = lax.axis_index(axis)
        right, left = lax.rem(me + 1, n), lax.rem(me + n - 1, n)
        neighbour_barrier(axis, left, right)
        own = pltpu.make_async_copy(x_ref, gathered.at[me], copy_sem)
        own.start()
        own.wait()

        def step(s, carry):
            slot = lax.rem(me - s + n, n)  # the block of device me - s
            send = pltpu.make_async_remote_copy(
                gathered.at[slot], gathered.at[slot], send_sem,
                recv_sems.at[jnp.minimum(s, n - 2)], device_id={axis: right})

            @pl.when(s < n - 1)  # the last block needs sending no further
            def _():
                send.start()

            load = pltpu.make_async_copy(gathered.at[slot], tile, copy_sem)
            load.start()
            load.wait()
            # the matmul runs while the block travels on to the right
            out_ref[slot] = jnp.dot(tile[...], w_ref[...],
                                    preferred_element_type=out_dtype)

            @pl.when(s < n - 1)
            def _():
                send.wait()  # sent, and the left neighbour's block is here
            return carry

        lax.fori_loop(0, n, step, 0)

    # The gather buffer lives in HBM: a second output (kernels get HBM
    # buffers as inputs or outputs, not as scratch), dropped afterwards.
    out, _ = pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct((n, m, w.shape[1]), out_dtype),
                   jax.ShapeDtypeStruct((n, *x.shape), x.dtype)),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec()],
        out_specs=(pl.BlockSpec(), pl.BlockSpec(memory_space=pl.ANY)),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype),
                        pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA,
                        pltpu.SemaphoreType.DMA((max(n - 1, 1),))],
        compiler_params=pltpu.CompilerParams(collective_id=0),
        interpret=interpret_mode(),
    )(x, w)
    return out.reshape(n * m, w.shape[1])
# [end:body]


# [start:pmap]
# No pmap form: the kernel addresses its peers by mesh coordinates
# (device_id={axis: peer}), which only shard_map gives it. Legacy pmap code
# calls lax.all_gather and multiplies (collective_matmul.py shows it).
# [end:pmap]


# [start:shard_map]
def kernel_allgather_matmul_shard_map(x, w, mesh):
    f = jax.shard_map(kernel_allgather_matmul_body, mesh=mesh,
                      in_specs=(P(AXIS), P(None, AXIS)), out_specs=P(None, AXIS),
                      check_vma=False)
    return jax.jit(f)(x, w)


def lax_allgather_matmul_shard_map(x, w, mesh):
    # What the kernel implements, for comparison: lax.all_gather, then matmul.
    f = jax.shard_map(lambda x, w: lax.all_gather(x, AXIS, tiled=True) @ w,
                      mesh=mesh, in_specs=(P(AXIS), P(None, AXIS)),
                      out_specs=P(None, AXIS))
    return jax.jit(f)(x, w)
# [end:shard_map]


# [start:jit]
def matmul_program(x, w):
    # x: [M, K] @ w: [K, N]; the shardings make jit gather x's rows
    return x @ w


def matmul_jit(x, w, mesh):
    f = jax.jit(matmul_program, in_shardings=(NamedSharding(mesh, P(AXIS)),
                                              NamedSharding(mesh, P(None, AXIS))),
                out_shardings=NamedSharding(mesh, P(None, AXIS)))
    return f(x, w)
# [end:jit]


# [start:explicit]
def allgather_matmul_explicit_program(x, w):
    # x: f32[M@axis, K], w: f32[K, N@axis]: the all-gather, written as what
    # it is: x resharded to replicated rows
    return jax.sharding.reshard(x, P()) @ w  # f32[M, N@axis]


def matmul_explicit(x, w, n_devices):
    mesh = make_mesh(n_devices, jax.sharding.AxisType.Explicit)
    with jax.set_mesh(mesh):
        x, w = jax.device_put(x, P(AXIS)), jax.device_put(w, P(None, AXIS))
        return jax.jit(allgather_matmul_explicit_program)(x, w)
# [end:explicit]


# [start:numpy]
def matmul_numpy(x, w):
    # in float64 (or int64), rounded once to the devices' dtype
    wide = np.float64 if np.issubdtype(np.result_type(x, w), np.floating) else None
    out = np.asarray(x, dtype=wide) @ np.asarray(w, dtype=wide)
    return out.astype(jnp.result_type(x.dtype, w.dtype))
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
    n = N_DEVICES
    mesh = make_mesh(n)
    rng = np.random.default_rng(0)
    # Small integers: every sum is exact in float32. x: a [64, 256] block of
    # rows on each device (64 KiB), w: [256, 128] columns on each.
    x = rng.integers(-8, 9, size=(n * 64, 256)).astype(np.float32)
    w = rng.integers(-8, 9, size=(256, n * 128)).astype(np.float32)
    want = matmul_numpy(x, w)
    results = {
        "shard_map (the kernel)": kernel_allgather_matmul_shard_map(x, w, mesh),
        "shard_map (lax, then @)": lax_allgather_matmul_shard_map(x, w, mesh),
        "jit": matmul_jit(x, w, mesh),
        "explicit": matmul_explicit(x, w, n),
    }
    for form, got in results.items():
        np.testing.assert_array_equal(np.asarray(got), want,
                                      err_msg=f"kernel_allgather_matmul ({form} form)")
    got = np.asarray(results["shard_map (the kernel)"])
    print(f"x: float32{list(x.shape)} (rows on {n} devices), w: float32"
          f"{list(w.shape)} (columns on {n} devices)")
    print(f"the kernel: {n} matmuls of [64, 256] @ [256, 128] a device, {n - 1} of "
          f"them beside a 64 KiB remote DMA; (x @ w)[0, :4] = "
          f"{got[0, :4].astype(int).tolist()}")
    print("ok: the kernel, lax.all_gather then @, jit and explicit equal x @ w "
          "exactly")


if __name__ == "__main__":
    main()
