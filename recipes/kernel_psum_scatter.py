"""Reduce-scatter as a Pallas kernel: partial sums go round a ring of remote DMAs.

What it shows: what ``lax.psum_scatter(x, "i", scatter_dimension=0,
tiled=True)`` does on the wire, written by hand as a Pallas TPU kernel.
Each device's block ``[n*c, m]`` is ``n`` chunks of ``c`` rows; device ``d``
must end with chunk ``d`` summed over all devices. The partial sum of chunk
``k`` starts on device ``k + 1`` (its own chunk ``k``) and travels right
round the ring for ``n - 1`` steps; each device it reaches adds its own
chunk ``k`` and sends it on, and the last add happens on device ``k``. At
step ``s`` device ``me`` sends the partial sum of chunk ``me - s - 1`` to
its right neighbour and receives that of chunk ``me - s - 2`` from its left
one: ``n - 1`` steps, each sending one chunk (``1/n`` of the block).

The bidirectional variant splits every chunk's columns in two: the first
half goes right round the ring as above, the second half left (the partial
sum of chunk ``k`` starts on device ``k - 1``). Two rings at once, each
carrying half the bytes: the same ``n - 1`` steps, half the time per step
on a link that carries both directions at once (a TPU's ICI does).

How it synchronises:

  * a barrier with both neighbours first (``get_barrier_semaphore`` with a
    ``collective_id``): a device may only write into a neighbour's receive
    slots once the neighbour has entered the kernel;
  * one receive slot and one receive semaphore per step (and per ring): the
    left neighbour writes slot ``s`` only at step ``s``, and this device
    reads it only after waiting for it, so a neighbour that runs ahead
    writes a slot nobody reads yet, never one still being read;
  * every remote DMA signals the sender's send semaphore (its data has
    left) and the receiver's receive semaphore (the bytes have landed).
    ``dma.wait()`` waits for both: this step's chunk has left, and the left
    neighbour's has arrived, before the device adds its own chunk to what
    arrived and sends the sum on.

Where the data lives: the block, the receive slots and the result are in
VMEM (the kernel adds them); ``n - 1`` slots of one chunk each take about
one block of scratch. On a TPU, Mosaic compiles the kernel. Anywhere else,
Pallas's TPU interpret mode (``interpret=pltpu.InterpretParams()``) runs it
on the CPU, simulating every device's memory, DMA engines and semaphores
(one thread per device). Interpret mode needs JAX 0.10.2 or newer here and
``PJRT_NPROC`` of at least twice the device count (``main()`` sets it).

Which form when: use ``lax.psum_scatter``; XLA picks the algorithm. Write
the kernel to control the exact DMAs, or to overlap them with compute in the
same kernel (reduce a gradient chunk while the next one travels). The sums
add the same numbers in another order than ``lax.psum_scatter`` may, so
floats can differ in the last bits; on small integers they are exact. The
jit and explicit forms below are the global program XLA partitions (what
the kernel is compared with), as in ``psum_scatter.py``: the explicit form
reuses the jit form's program, with no kernel in it, and compiles to XLA's
reduce-scatter (an all-reduce and a slice on XLA:CPU).

The kernels, the global programs and the NumPy oracle below are the ones
``collectives.RECIPES["kernel_psum_scatter"]`` and
``collectives.RECIPES["kernel_psum_scatter_bidirectional"]`` run (one mesh
axis; on a 2-D mesh, along that axis, the other axis's devices forming their
own rings).

Registered as: ``collectives.RECIPES["kernel_psum_scatter"]``,
``collectives.RECIPES["kernel_psum_scatter_bidirectional"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.10.2, 0.12.0.1 (interpret mode needs 0.10.2 or newer).
Run: ``python recipes/kernel_psum_scatter.py``
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


def chunk_view(x, n):
    # block [n*c, ...] -> [n, rows, cols]: chunk k (rows k*c:(k+1)*c) as a
    # matrix, its first dim the rows and the others flattened into columns;
    # a chunk with one column (a 1-D block) becomes one row of c columns
    c = x.shape[0] // n
    cols = math.prod(x.shape[1:])
    return x.reshape(n, c, cols) if cols > 1 else x.reshape(n, 1, c)


def ring_reduce_scatter(x, axis, rings):
    # x: [n*c, ...] -> [c, ...], chunk `me` of the sum over the devices of
    # `axis`. rings: (direction, first column, columns) for each ring, +1 to
    # send right, -1 to send left; together they cover each chunk's columns.
    n = lax.axis_size(axis)
    view = chunk_view(x, n)  # [n, rows, cols]
    _, rows, cols = view.shape

    def columns(ref, ring):
        _, first, width = ring
        return ref if width == cols else ref.at[:, pl.ds(first, width)]

    def kernel(x_ref, out_ref, *scratch):
        # scratch, per ring: its receive slots [n - 1, rows, width], its send
        # semaphore, its receive semaphores (one per step)
        me = lax.axis_index(axis)
        right, left = lax.rem(me + 1, n), lax.rem(me + n - 1, n)
        neighbour_barrier(axis, left, right)
        per_ring = [(ring, *scratch[3 * r:3 * r + 3]) for r, ring in enumerate(rings)]

        def step(s, first):
            # send the partial sum of chunk me - direction * (s + 1): at step 0
            # this device's own chunk, later what arrived last step plus ours
            copies = []
            for ring, slots, send_sem, recv_sems in per_ring:
                chunk = lax.rem(me - ring[0] * (s + 1) + n, n)
                mine = columns(x_ref.at[chunk], ring)
                if first:
                    src = mine
                else:
                    src = slots.at[s - 1]
                    src[...] += mine[...]
                dma = pltpu.make_async_remote_copy(
                    src, slots.at[s], send_sem, recv_sems.at[s],
                    device_id={axis: right if ring[0] == 1 else left})
                dma.start()
                copies.append(dma)
            for dma in copies:  # sent, and the neighbour's partial sum is here
                dma.wait()

        if n > 1:
            step(0, first=True)

            def later_step(s, carry):
                step(s, first=False)
                return carry

            lax.fori_loop(1, n - 1, later_step, 0)
        for ring, slots, _, _ in per_ring:
            # the partial sum of chunk `me` from every other device, plus ours
            own = columns(x_ref.at[me], ring)[...]
            total = own if n == 1 else slots[n - 2] + own
            columns(out_ref, ring)[...] = total

    scratch = []
    for _, _, width in rings:
        scratch += [pltpu.VMEM((max(n - 1, 1), rows, width), x.dtype),
                    pltpu.SemaphoreType.DMA,
                    pltpu.SemaphoreType.DMA((max(n - 1, 1),))]
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((rows, cols), x.dtype),
        scratch_shapes=scratch,
        compiler_params=pltpu.CompilerParams(collective_id=0),
        interpret=interpret_mode(),
    )(view)
    return out.reshape(x.shape[0] // n, *x.shape[1:])


def kernel_psum_scatter_body(x, axis=AXIS):
    # x: [n*c, m] on each device -> [c, m]: one ring, every column rightwards
    cols = chunk_view(x, lax.axis_size(axis)).shape[2]
    return ring_reduce_scatter(x, axis, rings=((1, 0, cols),))


def kernel_psum_scatter_bidirectional_body(x, axis=AXIS):
    # x: [n*c, m] on each device -> [c, m]: the first half of each chunk's
    # columns (the larger half, for an odd count) goes right, the rest left;
    # a chunk of one element has no second half and takes one ring
    cols = chunk_view(x, lax.axis_size(axis)).shape[2]
    half = cols - cols // 2
    rings = ((1, 0, half),) + (((-1, half, cols - half),) if cols > 1 else ())
    return ring_reduce_scatter(x, axis, rings=rings)


# [end:body]


# [start:pmap]
# No pmap form: the kernel addresses its peers by mesh coordinates
# (device_id={axis: peer}), which only shard_map gives it. Legacy pmap code
# calls lax.psum_scatter (psum_scatter.py shows it).
# [end:pmap]


# [start:shard_map]
def kernel_psum_scatter_shard_map(x, mesh, body=kernel_psum_scatter_body):
    # block: [n*c, m] -> [c, m], this device's slice of the sum; the
    # kernel's result is typed varying like the block, as psum_scatter's is
    f = jax.shard_map(body, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS),
                      check_vma=False)
    return jax.jit(f)(x)


def lax_psum_scatter_shard_map(x, mesh):
    # What the kernels implement, for comparison: lax.psum_scatter.
    f = jax.shard_map(
        lambda b: lax.psum_scatter(b, AXIS, scatter_dimension=0, tiled=True),
        mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS))
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def blocks(x, n):
    # x: [n*k, m] global -> [n, k, m]: the block each of n devices holds
    return x.reshape(n, x.shape[0] // n, *x.shape[1:])


def psum_scatter_program(x, n):
    # [n * n*c, m] -> [n*c, m], the sum of the n blocks; out_shardings that
    # keep it sharded by rows make XLA reduce and scatter in one go
    return blocks(x, n).sum(0, dtype=x.dtype)


def psum_scatter_jit(x, mesh):
    n = mesh.shape[AXIS]
    f = jax.jit(lambda x: psum_scatter_program(x, n),
                in_shardings=NamedSharding(mesh, P(AXIS)),
                out_shardings=NamedSharding(mesh, P(AXIS)))
    return f(x)
# [end:jit]


# [start:explicit]
def psum_scatter_explicit_program(x, n):
    # x: f32[n*n*c@i, m]: the jit form's program, no kernel, its sum over the
    # sharded blocks resharded to x's own split of rows: f32[n*c@i, m]
    return jax.sharding.reshard(psum_scatter_program(x, n),
                                jax.typeof(x).sharding.spec)


def psum_scatter_explicit(x, n_devices):
    mesh = make_explicit_mesh(n_devices)
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P(AXIS))  # float32[2048@i,1024]
        # float32[256@i,1024]
        return jax.jit(lambda x: psum_scatter_explicit_program(x, n_devices))(x)
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


def psum_scatter_numpy(x, n):
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
    want = psum_scatter_numpy(x, N_DEVICES)
    results = {
        "shard_map (the kernel)": kernel_psum_scatter_shard_map(x, mesh),
        "shard_map (the bidirectional kernel)": kernel_psum_scatter_shard_map(
            x, mesh, kernel_psum_scatter_bidirectional_body),
        "shard_map (lax.psum_scatter)": lax_psum_scatter_shard_map(x, mesh),
        "jit": psum_scatter_jit(x, mesh),
        "explicit": psum_scatter_explicit(x, N_DEVICES),
    }
    for form, got in results.items():
        np.testing.assert_array_equal(np.asarray(got), want,
                                      err_msg=f"kernel_psum_scatter ({form} form)")
    got = np.asarray(results["shard_map (the kernel)"])
    print(f"x: float32{list(x.shape)}, a [256, 1024] block (1 MiB) on each of "
          f"{N_DEVICES} devices; each keeps a [32, 1024] chunk of the sum")
    print(f"the kernel: {N_DEVICES - 1} ring steps, one 128 KiB remote DMA each; "
          f"the bidirectional one: {N_DEVICES - 1} steps of two 64 KiB DMAs, "
          "one each way")
    print("x[0, :3] + x[256, :3] + ... + x[1792, :3] (row 0 of every block):",
          x[0::256, :3].sum(0).tolist())
    print("device 0's result, row 0                                       :",
          got[0, :3].tolist())
    print("ok: both kernels, lax.psum_scatter, jit and explicit agree with NumPy "
          "bit for bit")


if __name__ == "__main__":
    main()
