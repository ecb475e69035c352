"""All-reduce as a Pallas kernel: a ring reduce-scatter, then a ring all-gather.

What it shows: what ``lax.psum(x, "i")`` does on the wire with the ring
algorithm, written by hand as one Pallas TPU kernel. Each device's block
``[k, m]`` is cut into ``n`` chunks of ``c = ceil(k / n)`` rows (zero rows
pad the block to ``n * c`` rows when ``n`` does not divide ``k``, and are
dropped from the result; zeros do not change a sum).

  * Reduce-scatter, ``n - 1`` steps: the partial sum of chunk ``j`` starts
    on device ``j + 1`` and travels right round the ring; each device it
    reaches adds its own chunk ``j`` and sends it on. At step ``s`` device
    ``me`` sends the partial sum of chunk ``me - s - 1``; after the last
    step it holds chunk ``me`` summed over every device.
  * All-gather, ``n - 1`` steps: each device sends the summed chunk it got
    last (its own at first) to its right neighbour, straight into the same
    slot of the neighbour's result, as ``kernel_all_gather.py`` does.

``2 (n - 1)`` steps, each sending one chunk (``1/n`` of the block): about
twice the block in all, whatever ``n``, where sending the whole block to
every device would send ``n - 1`` blocks.

How it synchronises:

  * a barrier with both neighbours first (``get_barrier_semaphore`` with a
    ``collective_id``): a device may only write into a neighbour's buffers
    once the neighbour has entered the kernel;
  * one receive slot and one receive semaphore per reduce-scatter step, and
    one receive semaphore per all-gather step: the left neighbour writes
    slot ``s`` only at step ``s`` and this device reads it only after
    waiting for it, so a neighbour that runs ahead (even into its
    all-gather, which writes result slots this device does not touch
    before then) never overwrites what is still being read;
  * every remote DMA signals the sender's send semaphore (its data has
    left) and the receiver's receive semaphore (the bytes have landed);
    ``dma.wait()`` waits for both before the next step.

Where the data lives: the block, the receive slots and the result are in
VMEM (the kernel adds them); ``n - 1`` slots of one chunk each take about
one block of scratch. On a TPU, Mosaic compiles the kernel. Anywhere else,
Pallas's TPU interpret mode (``interpret=pltpu.InterpretParams()``) runs it
on the CPU, simulating every device's memory, DMA engines and semaphores
(one thread per device). Interpret mode needs JAX 0.10.2 or newer here and
``PJRT_NPROC`` of at least twice the device count (``main()`` sets it).

Which form when: use ``lax.psum``; XLA picks the algorithm. Write the kernel
to control the exact DMAs, or to overlap them with compute in the same
kernel. The sums add the same numbers in another order than ``lax.psum``
may, so floats can differ in the last bits; on small integers they are
exact. The jit and explicit forms below are the global program XLA
partitions (what the kernel is compared with), as in ``reductions.py``: the
explicit form reuses the jit form's program, with no kernel in it, and
compiles to XLA's all-reduce.

The kernel, the global programs and the NumPy oracle below are the ones
``collectives.RECIPES["kernel_psum"]`` runs (one mesh axis; on a 2-D mesh,
along that axis, the other axis's devices forming their own rings).

Registered as: ``collectives.RECIPES["kernel_psum"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.10.2, 0.12.0.1 (interpret mode needs 0.10.2 or newer).
Run: ``python recipes/kernel_psum.py``
"""

import math
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
def neighbour_barrier(axis, left, right):
    # Signal both neighbours, wait for both: each has entered the kernel, so
    # its buffers exist and DMAs into them are safe. (Needs a collective_id.)
    barrier = pltpu.get_barrier_semaphore()
    for peer in (left, right):
        pl.semaphore_signal(barrier, 1, device_id={axis: peer})
    pl.semaphore_wait(barrier, 2)


def padded_chunks(x, n):
    # block [k, ...] -> [n, rows, cols]: zero rows pad it to n * c rows,
    # c = ceil(k / n); chunk j (rows j*c:(j+1)*c) as a matrix, its first dim
    # the rows and the others flattened into columns (a chunk with one
    # column, as a 1-D block's, becomes one row of c columns)
    c = -(-x.shape[0] // n)
    x = jnp.pad(x, [(0, n * c - x.shape[0])] + [(0, 0)] * (x.ndim - 1))
    cols = math.prod(x.shape[1:])
    return x.reshape(n, c, cols) if cols > 1 else x.reshape(n, 1, c)


def kernel_psum_body(x, axis=AXIS):
    # x: [k, m] on each device -> [k, m], the sum over the devices of `axis`,
    # the same on every device
    if x.ndim == 0:
        raise ValueError(
            f"kernel_psum: argument x is a scalar block (shape {x.shape}); the "
            "ring cuts a block into chunks of rows. Fix: pass x with at least "
            "one dimension, e.g. x.reshape(1).")
    if x.size == 0:
        return x  # an empty block sums to itself: nothing to send
    n = lax.axis_size(axis)
    view = padded_chunks(x, n)  # [n, rows, cols]

    def kernel(x_ref, out_ref, slots, send_sem, scatter_sems, gather_sems):
        me = lax.axis_index(axis)
        right, left = lax.rem(me + 1, n), lax.rem(me + n - 1, n)
        neighbour_barrier(axis, left, right)

        def send_right(src, dst, recv_sem):
            dma = pltpu.make_async_remote_copy(src, dst, send_sem, recv_sem,
                                               device_id={axis: right})
            dma.start()
            dma.wait()  # ours has left, and the left neighbour's is here

        # Reduce-scatter: at step s send the partial sum of chunk me - s - 1
        # (at step 0 our own chunk, later what arrived last step plus ours)
        # into the right neighbour's slot s.
        def scatter_step(s, carry):
            chunk = lax.rem(me - s - 1 + n, n)
            slots[s - 1] += x_ref[chunk]
            send_right(slots.at[s - 1], slots.at[s], scatter_sems.at[s])
            return carry

        if n > 1:
            first = lax.rem(me - 1 + n, n)  # our own chunk me - 1, as it is
            send_right(x_ref.at[first], slots.at[0], scatter_sems.at[0])
            lax.fori_loop(1, n - 1, scatter_step, 0)
        # chunk `me`: the partial sum from every other device, plus ours
        out_ref[me] = x_ref[me] if n == 1 else slots[n - 2] + x_ref[me]

        # All-gather: at step t send the summed chunk me - t (ours at t = 0,
        # then the one that arrived last step) into the same slot of the
        # right neighbour's result.
        def gather_step(t, carry):
            chunk = lax.rem(me - t + n, n)
            send_right(out_ref.at[chunk], out_ref.at[chunk], gather_sems.at[t])
            return carry

        lax.fori_loop(0, n - 1, gather_step, 0)

    steps = max(n - 1, 1)
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(view.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((steps, *view.shape[1:]), x.dtype),
                        pltpu.SemaphoreType.DMA,
                        pltpu.SemaphoreType.DMA((steps,)),
                        pltpu.SemaphoreType.DMA((steps,))],
        compiler_params=pltpu.CompilerParams(collective_id=0),
        interpret=interpret_mode(),
    )(view)
    # [n, rows, cols] -> the padded block's rows -> the block's k rows
    return out.reshape(-1, *x.shape[1:])[:x.shape[0]]


# [end:body]


# [start:pmap]
# No pmap form: the kernel addresses its peers by mesh coordinates
# (device_id={axis: peer}), which only shard_map gives it. Legacy pmap code
# calls lax.psum (reductions.py shows it).
# [end:pmap]


# [start:shard_map]
def kernel_psum_shard_map(x, mesh):
    # Every device returns the whole sum; the kernel's result is typed
    # varying, hence check_vma=False with the replicated out_specs.
    f = jax.shard_map(kernel_psum_body, mesh=mesh, in_specs=P(AXIS),
                      out_specs=P(), check_vma=False)
    return jax.jit(f)(x)


def lax_psum_shard_map(x, mesh):
    # What the kernel implements, for comparison: lax.psum.
    f = jax.shard_map(lambda b: lax.psum(b, AXIS), mesh=mesh, in_specs=P(AXIS),
                      out_specs=P())
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def blocks(x, n):
    # x: [n*k, m] global -> [n, k, m]: the block each of n devices holds
    return x.reshape(n, x.shape[0] // n, *x.shape[1:])


def psum_program(x, n):
    # the sum of the n blocks; replicated out_shardings make it an all-reduce
    return blocks(x, n).sum(0, dtype=x.dtype)


def psum_jit(x, mesh):
    n = mesh.shape[AXIS]
    f = jax.jit(lambda x: psum_program(x, n),
                in_shardings=NamedSharding(mesh, P(AXIS)),
                out_shardings=NamedSharding(mesh, P()))
    return f(x)
# [end:jit]


# [start:explicit]
def psum_explicit_program(x, n):
    # x: f32[n*k@i, m]: the jit form's program, unchanged, no kernel: the sum
    # over the sharded blocks is XLA's all-reduce, f32[k, m] on every device
    return psum_program(x, n)


def psum_explicit(x, n_devices):
    mesh = make_explicit_mesh(n_devices)
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P(AXIS))  # float32[2048@i,1024]
        # reshard says where the result lives: float32[256,1024], everywhere
        return jax.jit(lambda x: jax.sharding.reshard(
            psum_explicit_program(x, n_devices), P()))(x)
# [end:explicit]


# [start:numpy]
def wide(x):
    # x in the widest dtype of its kind, so NumPy rounds once, at the end
    x = np.asarray(x)
    for kind, dtype in ((jnp.complexfloating, np.complex128),
                        (jnp.floating, np.float64), (jnp.integer, np.int64)):
        if jnp.issubdtype(x.dtype, kind):
            return x.astype(dtype)
    return x


def psum_numpy(x, n):
    # integers wrap around as they do on the devices
    return blocks(wide(x), n).sum(0).astype(x.dtype)
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
    # 1 MiB per device: [256, 1024] float32 blocks, 8 chunks of 32 rows.
    # Small integers: every order of adding them gives the same float32 sum.
    rng = np.random.default_rng(0)
    x = rng.integers(-8, 9, size=(N_DEVICES * 256, 1024)).astype(np.float32)
    want = psum_numpy(x, N_DEVICES)
    results = {
        "shard_map (the kernel)": kernel_psum_shard_map(x, mesh),
        "shard_map (lax.psum)": lax_psum_shard_map(x, mesh),
        "jit": psum_jit(x, mesh),
        "explicit": psum_explicit(x, N_DEVICES),
    }
    for form, got in results.items():
        np.testing.assert_array_equal(np.asarray(got), want,
                                      err_msg=f"kernel_psum ({form} form)")
    # Blocks of 2 rows on 8 devices: padded to 8 rows, chunks of one row.
    small = rng.integers(-8, 9, size=(N_DEVICES * 2, 3)).astype(np.float32)
    padded = np.asarray(kernel_psum_shard_map(small, mesh))
    np.testing.assert_array_equal(padded, psum_numpy(small, N_DEVICES))
    got = np.asarray(results["shard_map (the kernel)"])
    print(f"x: float32{list(x.shape)}, a [256, 1024] block (1 MiB) on each of "
          f"{N_DEVICES} devices")
    print(f"the kernel: {N_DEVICES - 1} reduce-scatter and {N_DEVICES - 1} "
          "all-gather steps, one 128 KiB remote DMA each (1.75 MiB sent)")
    print("x[0, :3] + x[256, :3] + ... + x[1792, :3] (row 0 of every block):",
          x[0::256, :3].sum(0).tolist())
    print("the kernel's sum, row 0                                        :",
          got[0, :3].tolist())
    print(f"[2, 3] blocks, padded to 8 rows: the sum's row 0 is "
          f"{padded[0].tolist()} (= small[0::2].sum(0), "
          f"{small[0::2].sum(0).tolist()})")
    print("ok: the kernel, lax.psum, jit and explicit agree with NumPy "
          "bit for bit")


if __name__ == "__main__":
    main()
