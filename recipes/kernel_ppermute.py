"""ppermute as a Pallas kernel: each source DMAs its block to its destination.

What it shows: what ``lax.ppermute(x, "i", perm)`` does on the wire, written
by hand as a Pallas TPU kernel, for any static permutation ``perm`` (a list
of ``(source, destination)`` pairs known when the kernel is traced). Each
source sends its whole block with one remote DMA, straight into its
destination's output; a pair ``(d, d)`` is a local copy; a device that no
pair sends to fills its output with zeros, as ``lax.ppermute`` does. The
recipe's body is the ring shift by +1 of ``ppermute.py``:
``perm = [(s, (s + 1) % n) for s in range(n)]``, every device sending one
block and receiving one, in one step.

How it synchronises:

  * a barrier with one's peers only (``get_barrier_semaphore`` with a
    ``collective_id``): for each pair ``(s, d)``, ``s`` signals ``d`` and
    ``d`` signals ``s``, and each waits for one signal per pair it is in.
    A device may only write into a peer's output once the peer has entered
    the kernel; devices outside every pair do not wait at all;
  * the remote DMA signals two semaphores: the sender's send semaphore (its
    data has left: ``wait_send``) and the receiver's receive semaphore (the
    bytes have landed: ``wait_recv``). A sender that receives nothing waits
    only for its send, a receiver that sends nothing only for its receive:
    every semaphore is back at 0 when the kernel ends;
  * one step, one block per device each way: nothing can run ahead, so one
    receive semaphore suffices.

Where it runs: on a TPU, Mosaic compiles the kernel. Anywhere else, Pallas's
TPU interpret mode (``interpret=pltpu.InterpretParams()``) runs it on the CPU,
simulating every device's memory, DMA engines and semaphores (one thread per
device), bit for bit what ``lax.ppermute`` returns. Interpret mode needs
JAX 0.10.2 or newer here and ``PJRT_NPROC`` of at least twice the device
count (``main()`` sets it).

Which form when: use ``lax.ppermute``. Write the kernel to control the exact
DMAs, or to overlap them with compute in the same kernel (a collective
matmul sends the next block while multiplying this one). It costs one step:
each source sends one block, each destination receives one. The jit and
explicit forms below are the global program XLA partitions (what the
kernel is compared with), as in ``ppermute.py``: a roll by one block.

The kernel, the global programs and the NumPy oracle below are the ones
``collectives.RECIPES["kernel_ppermute"]`` runs (one mesh axis; on a 2-D
mesh, along that axis, the other axis's devices permuting among themselves).

Registered as: ``collectives.RECIPES["kernel_ppermute"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.10.2, 0.12.0.1 (interpret mode needs 0.10.2 or newer).
Run: ``python recipes/kernel_ppermute.py``
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


def ring(n, shift=1):
    # device s sends to device s + shift (mod n)
    return [(s, (s + shift) % n) for s in range(n)]


def checked_pairs(perm, n):
    # The rules of lax.ppermute: indices in range(n), no source and no
    # destination twice. The kernel's DMAs are planned from these pairs.
    pairs = [(int(s), int(d)) for s, d in perm]
    for pair in pairs:
        if not all(0 <= index < n for index in pair):
            raise ValueError(
                f"perm: pair {pair} has an index outside range({n}) (the axis "
                f"has {n} devices). Fix: use indices 0..{n - 1}.")
    for position, role in ((0, "source"), (1, "destination")):
        indices = [pair[position] for pair in pairs]
        for index in indices:
            if indices.count(index) > 1:
                raise ValueError(
                    f"perm: {role} {index} appears twice in {pairs}; each "
                    f"device sends at most one block and receives at most one. "
                    f"Fix: name every device at most once as a {role}.")
    return pairs


# [start:body]
def any_of(me, indices):
    # me == indices[0] or me == indices[1] or ... (a traced bool)
    hit = me == indices[0]
    for index in indices[1:]:
        hit = hit | (me == index)
    return hit


def peer_barrier(axis, me, remote):
    # Each pair's two devices signal each other, and each device waits for one
    # signal per pair it is in: its peers have entered the kernel, so their
    # buffers exist and DMAs into them are safe. (Needs a collective_id.)
    barrier = pltpu.get_barrier_semaphore()
    for s, d in remote:
        @pl.when(me == s)
        def _(d=d):  # (pl.when calls it at once: bind this pair's devices)
            pl.semaphore_signal(barrier, 1, device_id={axis: d})

        @pl.when(me == d)
        def _(s=s):
            pl.semaphore_signal(barrier, 1, device_id={axis: s})
    for s, d in remote:
        @pl.when((me == s) | (me == d))
        def _():
            pl.semaphore_wait(barrier, 1)


def kernel_permute(x, axis, perm):
    # x: any block on each device -> the block of the device whose pair names
    # this one as destination, or zeros where no pair does (lax.ppermute's
    # result). perm: (source, destination) pairs, static.
    n = lax.axis_size(axis)
    pairs = checked_pairs(perm, n)
    remote = [(s, d) for s, d in pairs if s != d]
    kept = [s for s, d in pairs if s == d]
    receivers = sorted({d for _, d in pairs})
    some_get_zeros = len(receivers) < n

    def kernel(x_ref, out_ref, send_sem, recv_sem, copy_sem, *zeros_ref):
        me = lax.axis_index(axis)
        if remote:
            peer_barrier(axis, me, remote)

        def to(d):  # this device's block, into device d's output
            return pltpu.make_async_remote_copy(x_ref, out_ref, send_sem, recv_sem,
                                                device_id={axis: d})

        for s, d in remote:
            @pl.when(me == s)
            def _(d=d):
                to(d).start()
        for s in kept:  # (s, s): the block stays, a local copy
            @pl.when(me == s)
            def _():
                own = pltpu.make_async_copy(x_ref, out_ref, copy_sem)
                own.start()
                own.wait()
        if some_get_zeros:  # no pair sends here: zeros, as lax.ppermute gives
            fill = (jnp.logical_not(any_of(me, receivers)) if receivers
                    else me >= 0)

            @pl.when(fill)
            def _():
                zeros_ref[0][...] = jnp.zeros(x.shape, x.dtype)
                copy = pltpu.make_async_copy(zeros_ref[0], out_ref, copy_sem)
                copy.start()
                copy.wait()
        for s, d in remote:
            @pl.when(me == s)
            def _(d=d):
                to(d).wait_send()  # our block has left

            @pl.when(me == d)
            def _(s=s):
                to(s).wait_recv()  # source s's block has landed in our output

    scratch = [pltpu.SemaphoreType.DMA] * 3
    if some_get_zeros:
        scratch.append(pltpu.VMEM(x.shape, x.dtype))
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=scratch,
        compiler_params=pltpu.CompilerParams(collective_id=0),
        interpret=interpret_mode(),
    )(x)


def kernel_ppermute_body(x, axis=AXIS):
    # x: [k, m] on each device -> [k, m], the previous device's block (the
    # ring shift by +1 of ppermute.py)
    return kernel_permute(x, axis, ring(lax.axis_size(axis), 1))


# [end:body]


# [start:pmap]
# No pmap form: the kernel addresses its peers by mesh coordinates
# (device_id={axis: peer}), which only shard_map gives it. Legacy pmap code
# calls lax.ppermute (ppermute.py shows it).
# [end:pmap]


# [start:shard_map]
def kernel_permute_shard_map(x, mesh, perm):
    # block: [k, m] -> the block its pair sends here, or zeros
    f = jax.shard_map(lambda b: kernel_permute(b, AXIS, perm), mesh=mesh,
                      in_specs=P(AXIS), out_specs=P(AXIS), check_vma=False)
    return jax.jit(f)(x)


def lax_ppermute_shard_map(x, mesh, perm):
    # What the kernel implements, for comparison: lax.ppermute.
    f = jax.shard_map(lambda b: lax.ppermute(b, AXIS, perm), mesh=mesh,
                      in_specs=P(AXIS), out_specs=P(AXIS))
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def ppermute_ring_program(x, n, shift=1):
    # Rolling by whole blocks moves every block `shift` devices on; jit
    # lowers it to a collective-permute.
    return jnp.roll(x, shift * (x.shape[0] // n), axis=0)


def ppermute_ring_jit(x, mesh):
    n = mesh.shape[AXIS]
    rows = NamedSharding(mesh, P(AXIS))
    f = jax.jit(lambda x: ppermute_ring_program(x, n), in_shardings=rows,
                out_shardings=rows)
    return f(x)
# [end:jit]


# [start:explicit]
def ppermute_ring_explicit_program(x, n, shift=1):
    # x: f32[n*k@axis, m]. A roll of a sharded dim has no sharding rule on
    # Explicit axes: auto_axes hands it to the partitioner (one
    # collective-permute) and out_sharding puts x's layout back in the types.
    return jax.sharding.auto_axes(lambda x: ppermute_ring_program(x, n, shift),
                                  out_sharding=jax.typeof(x).sharding)(x)


def ppermute_ring_explicit(x, n_devices):
    mesh = make_explicit_mesh(n_devices)
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P(AXIS))  # float32[2048@i,1024]
        return jax.jit(lambda x: jax.sharding.reshard(
            ppermute_ring_explicit_program(x, n_devices), P(AXIS)))(x)
# [end:explicit]


# [start:numpy]
def ppermute_ring_numpy(x, n, shift=1):
    return np.roll(x, shift * (x.shape[0] // n), axis=0)


def permute_numpy(x, n, perm):
    # block d of the result is block s of x for each pair (s, d), else zeros
    blocks = x.reshape(n, -1, *x.shape[1:])
    out = np.zeros_like(blocks)
    for s, d in perm:
        out[d] = blocks[s]
    return out.reshape(x.shape)
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
    # 1 MiB per device: [256, 1024] float32 blocks.
    x = np.arange(N_DEVICES * 256 * 1024, dtype=np.float32).reshape(-1, 1024)
    shift = ring(N_DEVICES, 1)
    want = ppermute_ring_numpy(x, N_DEVICES)
    results = {
        "shard_map (the kernel)": kernel_permute_shard_map(x, mesh, shift),
        "shard_map (lax.ppermute)": lax_ppermute_shard_map(x, mesh, shift),
        "jit": ppermute_ring_jit(x, mesh),
        "explicit": ppermute_ring_explicit(x, N_DEVICES),
    }
    for form, got in results.items():
        np.testing.assert_array_equal(np.asarray(got), want,
                                      err_msg=f"kernel_ppermute ({form} form)")
    # Any static permutation: a swap of 0 and 1, device 2 keeps its block, 5
    # sends to 3; devices 4, 5, 6 and 7 receive nothing and get zeros.
    perm = [(0, 1), (1, 0), (2, 2), (5, 3)]
    some = np.asarray(kernel_permute_shard_map(x, mesh, perm))
    np.testing.assert_array_equal(some,
                                  np.asarray(lax_ppermute_shard_map(x, mesh, perm)))
    np.testing.assert_array_equal(some, permute_numpy(x, N_DEVICES, perm))
    got = np.asarray(results["shard_map (the kernel)"])
    print(f"x: float32{list(x.shape)}, a [256, 1024] block (1 MiB) on each of "
          f"{N_DEVICES} devices")
    print(f"ring shift +1: 1 step, one 1 MiB remote DMA per device; device 1's "
          f"block starts {got[256, :3].tolist()} (= x[0], device 0's)")
    firsts = some.reshape(N_DEVICES, -1)[:, 0].astype(int).tolist()
    print(f"perm {perm}: each device's first value {firsts} (zeros where no "
          f"pair sends)")
    print("ok: the kernel, lax.ppermute, jit and explicit agree with NumPy "
          "bit for bit")


if __name__ == "__main__":
    main()
