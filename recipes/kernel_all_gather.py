"""All-gather as a Pallas kernel: a ring of remote DMAs, one level under lax.

What it shows: what ``lax.all_gather(x, "i", tiled=True)`` does on the
wire, written by hand as a Pallas TPU kernel. Each device copies its own
block into slot ``me`` of its output, then for ``n - 1`` steps sends the
slot it received last (``(me - step) mod n``) to its right neighbour with a
remote DMA, straight into the same slot of the neighbour's output. After
``n - 1`` steps every slot is full on every device: the gathered array.

How it synchronises:

  * a barrier with both neighbours first (``get_barrier_semaphore`` with a
    ``collective_id``): a device may only write into a neighbour's output
    once the neighbour has entered the kernel;
  * every remote DMA signals two semaphores: the sender's send semaphore
    (its data has left) and the receiver's receive semaphore (the bytes have
    landed). A device waits on its receive semaphore before it forwards the
    slot it just got, and on its send semaphore before the kernel ends;
  * one receive semaphore per step (``SemaphoreType.DMA((n - 1,))``): with
    one for all steps, a fast left neighbour's next DMA could count towards
    this step's wait (the race detector reports it).

Where it runs: on a TPU, Mosaic compiles the kernel. Anywhere else, Pallas's
TPU interpret mode (``interpret=pltpu.InterpretParams()``) runs it on the CPU,
simulating every device's memory, DMA engines and semaphores (one thread per
device), bit for bit what ``lax.all_gather`` returns. Interpret mode needs
JAX 0.10.2 or newer here and ``PJRT_NPROC`` of at least twice the device
count (``main()`` sets it): with fewer XLA:CPU threads than waiting devices,
a kernel of more than about 100 KiB per device never finishes.

Which form when: use ``lax.all_gather``; XLA picks the algorithm. Write the
kernel to control the exact DMAs, to overlap them with compute in the same
kernel (see ``kernel_collective_matmul.py``), or to learn what the collective
costs: ``n - 1`` steps, each sending one block. The jit and explicit forms
below are the global program XLA partitions (what the kernel is compared
with), as in ``all_gather.py``: the explicit form reuses the jit form's
program, with no kernel in it, and compiles to XLA's all-gather.

The kernel, the global programs and the NumPy oracle below are the ones
``collectives.RECIPES["kernel_all_gather"]`` runs (one mesh axis; on a 2-D
mesh, along that axis, the other axis's devices forming their own rings).

Registered as: ``collectives.RECIPES["kernel_all_gather"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.10.2, 0.12.0.1 (interpret mode needs 0.10.2 or newer).
Run: ``python recipes/kernel_all_gather.py``
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
def neighbour_barrier(axis, left, right):
    # Signal both neighbours, wait for both: each has entered the kernel, so
    # its buffers exist and DMAs into them are safe. (Needs a collective_id.)
    barrier = pltpu.get_barrier_semaphore()
    for peer in (left, right):
        pl.semaphore_signal(barrier, 1, device_id={axis: peer})
    pl.semaphore_wait(barrier, 2)


def kernel_all_gather_body(x, axis=AXIS):
    # x: [k, m] on each device -> [n*k, m], the same on every device of `axis`
    n = lax.axis_size(axis)

    def kernel(x_ref, out_ref, copy_sem, send_sem, recv_sems):
        me = lax.axis_index(axis)
        right, left = lax.rem(me + 1, n), lax.rem(me + n - 1, n)
        neighbour_barrier(axis, left, right)
        own = pltpu.make_async_copy(x_ref, out_ref.at[me], copy_sem)
        own.start()
        own.wait()

        def step(s, carry):
            # send the block that arrived last step (our own at step 0) on to
            # the right; the left neighbour's block lands in slot me - s - 1
            slot = lax.rem(me - s + n, n)
            dma = pltpu.make_async_remote_copy(
                out_ref.at[slot], out_ref.at[slot], send_sem, recv_sems.at[s],
                device_id={axis: right})
            dma.start()
            dma.wait()  # our send has left and the left neighbour's block is here
            return carry

        lax.fori_loop(0, n - 1, step, 0)

    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((n, *x.shape), x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA,
                        pltpu.SemaphoreType.DMA((max(n - 1, 1),))],
        compiler_params=pltpu.CompilerParams(collective_id=0),
        interpret=interpret_mode(),
    )(x)
    return out.reshape(n * x.shape[0], *x.shape[1:])
# [end:body]


# [start:pmap]
# No pmap form: the kernel addresses its peers by mesh coordinates
# (device_id={axis: peer}), which only shard_map gives it. Legacy pmap code
# calls lax.all_gather (all_gather.py shows it).
# [end:pmap]


# [start:shard_map]
def kernel_all_gather_shard_map(x, mesh):
    # Every device returns the whole array; the kernel's result is typed
    # varying, hence check_vma=False with the replicated out_specs.
    f = jax.shard_map(kernel_all_gather_body, mesh=mesh, in_specs=P(AXIS),
                      out_specs=P(), check_vma=False)
    return jax.jit(f)(x)


def lax_all_gather_shard_map(x, mesh):
    # What the kernel implements, for comparison: lax.all_gather.
    f = jax.shard_map(lambda b: lax.all_gather(b, AXIS, tiled=True), mesh=mesh,
                      in_specs=P(AXIS), out_specs=P(), check_vma=False)
    return jax.jit(f)(x)
# [end:shard_map]


# [start:jit]
def all_gather_program(x):
    # The value does not change; the replicated out_shardings make XLA gather.
    return x


def all_gather_jit(x, mesh):
    f = jax.jit(all_gather_program, in_shardings=NamedSharding(mesh, P(AXIS)),
                out_shardings=NamedSharding(mesh, P()))
    return f(x)
# [end:jit]


# [start:explicit]
def all_gather_explicit_program(x):
    # x: f32[n*k@i, m]: the jit form's program (x itself), no kernel,
    # resharded to whole rows on every device: XLA's all-gather
    _, *rest = jax.typeof(x).sharding.spec
    return jax.sharding.reshard(all_gather_program(x), P(None, *rest))


def all_gather_explicit(x, n_devices):
    mesh = make_explicit_mesh(n_devices)
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P(AXIS))  # float32[8192@i,128]
        return jax.jit(all_gather_explicit_program)(x)  # float32[8192,128]
# [end:explicit]


# [start:numpy]
def all_gather_numpy(x):
    return np.array(x)  # a copy: the same values, now on every device
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
    # 1 MiB per device: [256, 1024] float32 blocks, 8 MiB gathered.
    x = np.arange(N_DEVICES * 256 * 1024, dtype=np.float32).reshape(-1, 1024)
    want = all_gather_numpy(x)
    results = {
        "shard_map (the kernel)": kernel_all_gather_shard_map(x, mesh),
        "shard_map (lax.all_gather)": lax_all_gather_shard_map(x, mesh),
        "jit": all_gather_jit(x, mesh),
        "explicit": all_gather_explicit(x, N_DEVICES),
    }
    for form, got in results.items():
        np.testing.assert_array_equal(np.asarray(got), want,
                                      err_msg=f"kernel_all_gather ({form} form)")
    got = np.asarray(results["shard_map (the kernel)"])
    print(f"x: float32{list(x.shape)}, a [256, 1024] block (1 MiB) on each of "
          f"{N_DEVICES} devices")
    print(f"the kernel: {N_DEVICES - 1} ring steps, one 1 MiB remote DMA each; "
          f"gathered row 256 starts {got[256, :3].tolist()} (= x[256], device 1's)")
    print("ok: the kernel, lax.all_gather, jit and explicit agree with NumPy "
          "bit for bit")


if __name__ == "__main__":
    main()
