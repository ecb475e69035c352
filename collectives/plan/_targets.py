"""The hardware a plan compiles for without it: the target's own compiler.

``plan --target h100`` compiles each strategy's unit with XLA:GPU for H100s
(the CUDA plugin, ``jax-cuda12-plugin``: no GPU and no CUDA wheels needed),
``--target v5p`` (``v5e``, ``v6e``) with the TPU compiler (``libtpu``): JAX
describes the target's devices (``jax.experimental.topologies``) and lowers
and compiles for them ahead of time. The ``target`` extra (``pip install
'.[target]'`` in a checkout; ``pip install 'jax[tpu,cuda12-local]'`` is the
same) installs both compilers, matched to the installed JAX by its extras.

This module runs in the parent (names, topologies, checks) and in the
compiling child (:func:`target_mesh`, :func:`compiler_text`).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Target:
    """One kind of accelerator a plan can compile for.

    Attributes:
      name: what ``--target`` takes, e.g. ``"h100"``.
      platform: JAX's platform for its topology, ``"cuda"`` or ``"tpu"``.
      chip: the chip, as the interconnect profiles name it.
      package: the distribution that brings its compiler.
      interconnect: the profile ``plan`` uses by default for its links, or
        ``None`` where none ships (give ``--interconnect``).
      per_host: devices per host (a GPU node's, a TPU host's chips).
      torus: a TPU generation's torus dimensions (3 for v5p, 2 for v5e and
        v6e); 0 for a GPU.
      max_devices: the most devices one slice of it holds (a TPU pod slice),
        or ``None``.
      gpu: a GPU's description for XLA:GPU (the fields of its target config).
    """

    name: str
    platform: str
    chip: str
    package: str
    interconnect: str | None
    per_host: int
    torus: int = 0
    max_devices: int | None = None
    gpu: tuple[tuple[str, Any], ...] = ()

    def topology(self, devices: int) -> str:
        """The topology JAX names for ``devices`` of this target: ``1xHx8``
        (one slice of H hosts of 8 GPUs), or a TPU slice's torus, as near a
        cube (v5p) or a square (v5e, v6e) as powers of two allow.

        Raises:
          ValueError: a count the target has no slice of, with the fix.
        """
        if self.platform == "cuda":
            if devices % self.per_host:
                raise ValueError(
                    f"--target {self.name}: {devices} devices are not whole nodes of "
                    f"{self.per_host} GPUs. Fix: plan for a multiple of "
                    f"{self.per_host}.")
            return f"1x{devices // self.per_host}x{self.per_host}"
        if devices < 4 or devices & (devices - 1) or (
                self.max_devices and devices > self.max_devices):
            top = f" and at most {self.max_devices}" if self.max_devices else ""
            raise ValueError(
                f"--target {self.name}: {devices} chips make no {self.chip} slice "
                f"(a power of two, at least 4{top}). Fix: plan for such a count, or "
                f"name a topology with --topology (e.g. "
                f"{self.name}:{'x'.join(['4'] * self.torus)}).")
        sides = [1] * self.torus
        for _ in range(int(math.log2(devices))):
            sides[sides.index(min(sides))] *= 2
        return f"{self.name}:{'x'.join(map(str, sorted(sides)))}"

    def config(self) -> str:
        """XLA:GPU's target config (a ``GpuTargetConfigProto`` in text form)
        for this GPU: what XLA:GPU asks a present GPU."""
        fields = dict(self.gpu)
        major, minor = fields.pop("compute_capability")
        description = fields.pop("description")
        lines = [f"  {key}: {value}" for key, value in fields.items()]
        lines.append(f"  cuda_compute_capability {{ major: {major} minor: {minor} }}")
        return ("gpu_device_info {\n" + "\n".join(lines) + "\n}\n"
                'platform_name: "CUDA"\n'
                f'device_description_str: "{description}"\n')


# The H100 SXM's figures as its deviceQuery reports them: 132 SMs of 128
# cores, 1.98 GHz, 80 GB HBM3 at 3.35 TB/s, 50 MB of L2, 228 KiB of shared
# memory per SM (227 KiB opt-in per block), compute capability 9.0.
_H100 = (
    ("threads_per_block_limit", 1024), ("threads_per_warp", 32),
    ("shared_memory_per_block", 49152), ("shared_memory_per_core", 233472),
    ("threads_per_core_limit", 2048), ("core_count", 132), ("fpus_per_core", 128),
    ("block_dim_limit_x", 2147483647), ("block_dim_limit_y", 65535),
    ("block_dim_limit_z", 65535), ("memory_bandwidth", 3352320000000),
    ("l2_cache_size", 52428800), ("clock_rate_ghz", 1.98),
    ("device_memory_size", 84978434048), ("shared_memory_per_block_optin", 232448),
    ("registers_per_core_limit", 65536), ("registers_per_block_limit", 65536),
    ("compute_capability", (9, 0)), ("description", "NVIDIA H100 80GB HBM3"),
)

TARGETS: dict[str, Target] = {
    "h100": Target("h100", "cuda", "H100 SXM", "jax-cuda12-plugin", "dgx-h100",
                   per_host=8, gpu=_H100),
    "v5p": Target("v5p", "tpu", "TPU v5p", "libtpu", "tpu-v5p-ici", per_host=4,
                  torus=3, max_devices=8960),
    "v5e": Target("v5e", "tpu", "TPU v5e", "libtpu", None, per_host=4, torus=2,
                  max_devices=256),
    "v6e": Target("v6e", "tpu", "TPU v6e", "libtpu", None, per_host=4, torus=2,
                  max_devices=256),
}
"""The targets ``plan --target`` compiles for, by name."""


def target_named(name: str) -> Target:
    """The target ``name`` names; a ``ValueError`` naming the choices if none."""
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"--target: unknown target {name!r}; known: "
                         f"{', '.join(TARGETS)}.") from None


def target_of_topology(topology: str) -> Target:
    """The TPU target a topology name such as ``v5p:8x16x16`` is of."""
    name = topology.partition(":")[0]
    target = TARGETS.get(name)
    if target is None or target.platform != "tpu":
        tpus = [t.name for t in TARGETS.values() if t.platform == "tpu"]
        raise ValueError(f"--topology {topology!r}: expected a TPU topology "
                         f"GENERATION:AxBxC of {', '.join(tpus)}, e.g. v5p:8x16x16.")
    return target


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def install_hint(target: Target) -> str:
    return ("pip install 'jax[tpu,cuda12-local]' (the target extra: the "
            f"{'TPU' if target.platform == 'tpu' else 'CUDA'} compiler matched to "
            "your JAX; no accelerator needed)")


def target_mesh(target: Target, topology: str, shape: Sequence[int],
                names: Sequence[str]) -> Any:
    """A mesh of the target's devices for ``topology``, for compiling only.

    Raises:
      SystemExit: the compiler is missing or refuses the topology, or its
        device count is not the mesh's (one line naming the fix; the plan
        shows it as the flag's error).
    """
    import jax
    from jax.experimental import mesh_utils
    from jax.experimental import topologies

    flag = (f"--topology {topology!r}" if ":" in topology
            else f"--target {target.name}")
    try:
        if target.platform == "cuda":
            topo = topologies.get_topology_desc(
                platform="cuda", topology=topology, target_config=target.config())
        else:
            topo = topologies.get_topology_desc(topology, platform="tpu")
    except Exception as err:  # no compiler, or a name it does not know
        raise SystemExit(
            f"{flag}: JAX cannot describe topology {topology!r} "
            f"({type(err).__name__}: {str(err)[:300]}). Fix: "
            f"{install_hint(target)}, and name a topology such as v5p:8x16x16 or "
            "v5e:16x16.") from None
    devices = list(topo.devices)
    if len(devices) != math.prod(shape):
        raise SystemExit(
            f"{flag}: topology {topology!r} has {len(devices)} devices, the mesh "
            f"{dict(zip(names, shape, strict=True))} {math.prod(shape)}. Fix: give a "
            "mesh of as many devices (--mesh or --devices).")
    if target.platform == "tpu":
        grid = mesh_utils.create_device_mesh(tuple(shape), devices,
                                             allow_split_physical_axes=True)
    else:  # a GPU mesh: each node's 8 GPUs along the last axis
        import numpy as np
        grid = np.array(devices, dtype=object).reshape(tuple(shape))
    return jax.sharding.Mesh(grid, tuple(names))


def compiler_text(target: Target, topology: str) -> str:
    """The compiler and its version, as a plan names it."""
    if target.platform == "cuda":
        major, minor = dict(target.gpu)["compute_capability"]
        return (f"XLA:GPU ({target.package} {_version(target.package)}) for "
                f"{target.chip} (sm_{major}{minor}), topology {topology}, without "
                "the hardware")
    return (f"TPU compiler ({target.package} {_version(target.package)}) for "
            f"{target.chip}, topology {topology}, without the hardware")
