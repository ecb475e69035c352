"""Interconnect profiles: what one collective costs on a named link.

A profile gives ``alpha`` (seconds per collective) and a bus bandwidth
(bytes per second per device, nccl-tests' busbw), per collective kind where
they differ, with the source of its figures. A collective takes
``alpha + sent / busbw``, ``sent`` being the bytes one device sends in it
(:func:`collectives.hlo.bytes_moved`), the same line ``bench`` fits to its
measurements.

The default, ``measured``, is that fit: a short ``bench`` sweep of each
collective kind on this machine's simulated devices, cached per machine and
JAX version. The named profiles ship in ``profiles.toml`` beside this module;
``--profiles FILE`` adds profiles from a TOML or JSON file of that form.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from collectives._compat import mesh_scope
from collectives._environment import cache_folder
from collectives.hlo import KINDS

MEASURED = "measured"
_SHIPPED = Path(__file__).with_name("profiles.toml")
# bench's collective for each kind, timed in its shard_map form
_BENCHED = {"all-reduce": "psum", "all-gather": "all_gather",
            "reduce-scatter": "psum_scatter", "all-to-all": "all_to_all",
            "collective-permute": "ppermute_ring"}
MEASURE_ARGS = ("-b", "4K", "-e", "4M", "-f", "4", "--budget", "0.2")
"""The sweep ``measured`` runs: 6 sizes of each kind, 0.2 s each."""


@dataclasses.dataclass(frozen=True)
class Link:
    """One collective's cost on a link: ``alpha + sent / busbw`` seconds."""

    alpha: float  # seconds
    busbw: float  # bytes per second per device

    def seconds(self, sent: float) -> float:
        """Seconds for one collective in which a device sends ``sent`` bytes."""
        return self.alpha + sent / self.busbw


@dataclasses.dataclass(frozen=True)
class Profile:
    """A named interconnect.

    Attributes:
      name: e.g. ``"nvlink-h100"``.
      link: the cost of every kind not in ``kinds``.
      kinds: per-kind costs where they differ.
      description: what it is.
      source: where the figures come from.
      chip: the accelerator at the ends of the link, e.g. ``"H100 SXM"``.
      peak_flops: the chip's peak dense FLOP/s per dtype name
        (``"bfloat16"``, ``"float32"``); a dtype not named has no figure.
      peak_source: where the peak figures come from.
      torus: for a TPU's ICI, the generation whose torus the link is one
        axis of (a key of :data:`collectives.plan.TARGETS`, e.g. ``"v5p"``):
        a plan gives a mesh axis that spans ``k`` of the torus's axes ``k``
        times the bandwidth; empty for other links.
      whole_buffers: charge a collective over ``n`` devices for its whole
        buffer, leaving out the ring's ``(n - 1)/n`` (the scaling book's
        approximation: "an AllGather costs V / W"); ``False`` (every
        profile a file gives): what a device really sends.

    Examples:
      >>> from collectives.plan import load_profiles
      >>> p = load_profiles()["ib-ndr"]
      >>> round(p.seconds("all-reduce", 50e9) , 6)  # 50 GB at 50 GB/s, + 20 us
      1.00002
    """

    name: str
    link: Link
    kinds: Mapping[str, Link] = dataclasses.field(default_factory=dict)
    description: str = ""
    source: str = ""
    chip: str = ""
    peak_flops: Mapping[str, float] = dataclasses.field(default_factory=dict)
    peak_source: str = ""
    torus: str = ""
    whole_buffers: bool = False

    def peak(self, dtype: str) -> float | None:
        """The chip's peak FLOP/s in ``dtype``, or ``None`` where the profile
        has no figure for it."""
        return self.peak_flops.get(dtype)

    def for_kind(self, kind: str) -> Link:
        """The :class:`Link` a collective of ``kind`` pays."""
        return self.kinds.get(kind, self.link)

    def seconds(self, kind: str, sent: float) -> float:
        """Seconds for one collective of ``kind`` sending ``sent`` bytes per
        device."""
        return self.for_kind(kind).seconds(sent)

    def slowest(self, other: Profile) -> Profile:
        """The profile whose every kind takes the larger alpha and the
        smaller bandwidth of the two (a collective over both links waits on
        the slower)."""
        if other is self:
            return self
        kinds = {kind: _worse(self.for_kind(kind), other.for_kind(kind))
                 for kind in KINDS}
        return Profile(name=f"{self.name}+{other.name}",
                       link=_worse(self.link, other.link), kinds=kinds,
                       chip=self.chip, peak_flops=self.peak_flops,
                       peak_source=self.peak_source,
                       whole_buffers=self.whole_buffers or other.whole_buffers)


def profile_json(profile: Profile) -> dict[str, Any]:
    """A profile as a table of a profiles file (:func:`profile_from` reads it)."""
    def figures(link: Link) -> dict[str, float]:
        return {"alpha_us": link.alpha * 1e6, "busbw_GBps": link.busbw / 1e9}

    return {"name": profile.name, **figures(profile.link),
            "kinds": {kind: figures(link) for kind, link in profile.kinds.items()},
            "description": profile.description, "source": profile.source,
            "chip": profile.chip,
            "peak_TFLOPs": {dtype: flops / 1e12
                            for dtype, flops in profile.peak_flops.items()},
            "peak_source": profile.peak_source,
            **({"torus": profile.torus} if profile.torus else {}),
            **({"whole_buffers": True} if profile.whole_buffers else {})}


def _worse(a: Link, b: Link) -> Link:
    return Link(alpha=max(a.alpha, b.alpha), busbw=min(a.busbw, b.busbw))


def _link(entry: Mapping[str, Any], where: str, base: Link | None = None) -> Link:
    alpha = entry.get("alpha_us", None if base is None else base.alpha * 1e6)
    busbw = entry.get("busbw_GBps", None if base is None else base.busbw / 1e9)
    if not isinstance(alpha, (int, float)) or alpha < 0:
        raise ValueError(f"{where}: alpha_us={alpha!r}; expected a number of "
                         "microseconds >= 0.")
    if not isinstance(busbw, (int, float)) or busbw <= 0:
        raise ValueError(f"{where}: busbw_GBps={busbw!r}; expected a positive "
                         "bandwidth in GB/s (1e9 bytes per second).")
    return Link(alpha=float(alpha) * 1e-6, busbw=float(busbw) * 1e9)


def profile_from(name: str, entry: Mapping[str, Any], where: str) -> Profile:
    """A :class:`Profile` from one table of a profiles file.

    Raises:
      ValueError: a figure is missing or not a positive number, or a kind
        is not an HLO collective kind; the message names the file and key.
    """
    here = f"{where}: profile {name!r}"
    link = _link(entry, here)
    kinds = {}
    for kind, override in dict(entry.get("kinds", {})).items():
        if kind not in KINDS:
            raise ValueError(f"{here}: kinds.{kind} is not a collective kind; "
                             f"expected one of {', '.join(KINDS)}.")
        kinds[kind] = _link(override, f"{here} kinds.{kind}", base=link)
    peaks = {}
    for dtype, tflops in dict(entry.get("peak_TFLOPs", {})).items():
        if not isinstance(tflops, (int, float)) or tflops <= 0:
            raise ValueError(f"{here}: peak_TFLOPs.{dtype}={tflops!r}; expected a "
                             "positive number of TFLOP/s (1e12 per second).")
        peaks[str(dtype)] = float(tflops) * 1e12
    return Profile(name=name, link=link, kinds=kinds,
                   description=str(entry.get("description", "")),
                   source=str(entry.get("source", "")),
                   chip=str(entry.get("chip", "")), peak_flops=peaks,
                   peak_source=str(entry.get("peak_source", "")),
                   torus=_torus(entry.get("torus", ""), here),
                   whole_buffers=_flag(entry.get("whole_buffers", False),
                                       f"{here}: whole_buffers"))


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where}={value!r}; expected true or false.")
    return value


def _torus(value: Any, where: str) -> str:
    from collectives.plan._targets import TARGETS

    tori = [t.name for t in TARGETS.values() if t.torus]
    if value and value not in tori:
        raise ValueError(f"{where}: torus={value!r}; expected one of "
                         f"{', '.join(tori)} (the TPU whose torus the link is an "
                         "axis of), or no torus key.")
    return str(value)


def spanned(profile: Profile, span: int) -> Profile:
    """``profile`` for a mesh axis spanning ``span`` axes of its torus: each
    kind's bandwidth ``span`` times (a collective over several torus axes
    sends over all their links at once)."""
    if span <= 1:
        return profile

    def wider(link: Link) -> Link:
        return Link(alpha=link.alpha, busbw=link.busbw * span)

    return dataclasses.replace(
        profile, name=f"{profile.name} x{span}", link=wider(profile.link),
        kinds={kind: wider(link) for kind, link in profile.kinds.items()},
        description=f"{profile.description}; this mesh axis spans {span} axes "
                    "of the torus, their links at once")


def read_profiles(path: str | os.PathLike[str]) -> dict[str, Profile]:
    """The profiles in a TOML or JSON file (a table per profile).

    Raises:
      ValueError: the file cannot be read or parsed, or a profile is wrong.
    """
    path = Path(path)
    try:
        text = path.read_text()
        tables = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as err:
        raise ValueError(f"--profiles {str(path)!r}: cannot read it ({err}). Fix: "
                         "pass a TOML or JSON file of tables as in "
                         "collectives/plan/profiles.toml.") from None
    return {name: profile_from(name, entry, str(path))
            for name, entry in tables.items()}


def load_profiles(*extra: str | os.PathLike[str]) -> dict[str, Profile]:
    """The shipped named profiles, then those of ``extra`` files (a name
    given again replaces the earlier one)."""
    profiles = read_profiles(_SHIPPED)
    for path in extra:
        profiles.update(read_profiles(path))
    return profiles


# -- measured on this machine --------------------------------------------------

def _cache_path() -> Path:
    return cache_folder() / "measured-profile.json"


def _machine_key(devices: int) -> dict[str, Any]:
    return {"host": platform.node(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "jax": jax.__version__, "devices": devices}


def measured_profile(devices: int = 8, *, remeasure: bool = False,
                     log: Any = None) -> Profile:
    """The ``measured`` profile: bench's alpha-beta fit per collective kind
    on ``devices`` simulated CPU devices of this machine.

    The sweep (``MEASURE_ARGS``, about 20 s) runs once per machine and
    JAX version; its fits are cached (``$XDG_CACHE_HOME/jax-collectives``).
    A negative fitted alpha (within its interval of 0) counts as 0.
    """
    key = _machine_key(devices)
    cache = _cache_path()
    if not remeasure and cache.exists():
        try:
            stored = json.loads(cache.read_text())
            if stored.get("key") == key:
                if "peaks" not in stored:  # cached before peaks were measured
                    stored["peaks"] = measured_peaks(devices)
                    cache.write_text(json.dumps(stored, indent=1))
                return _from_fits(stored["fits"], stored["peaks"], stored["when"],
                                  key, cache)
        except (OSError, ValueError, KeyError):
            pass
    if log is not None:
        print(f"measuring this machine's collectives ({devices} simulated CPU "
              "devices, about 20 s; cached after) ...", file=log, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        subprocess.run(
            [sys.executable, "-m", "collectives", "bench", "--devices", str(devices),
             "-c", *_BENCHED.values(), "--forms", "shard_map", *MEASURE_ARGS,
             "--no-memory", "-q", "--json", str(out)],
            check=True, stdout=subprocess.DEVNULL, timeout=600)
        doc = json.loads(out.read_text())
    fits = {fit["kind"]: {"alpha_us": max(0.0, fit["alpha_us"]),
                          "busbw_GBps": fit["busbw_gbps"]}
            for fit in doc["fit"] if fit["form"] == "shard_map"
            and fit["collective"] == _BENCHED.get(fit["kind"])}
    when = time.strftime("%Y-%m-%d")
    peaks = measured_peaks(devices)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"key": key, "fits": fits, "peaks": peaks,
                                 "when": when}, indent=1))
    return _from_fits(fits, peaks, when, key, cache)


PEAK_SIDE = 1024
"""The square matmul :func:`measured_peaks` times."""


def measured_peaks(devices: int) -> dict[str, float]:
    """TFLOP/s of one simulated CPU device of this machine, per dtype: the
    best of five ``PEAK_SIDE``-square matmuls on one device, divided by
    ``devices`` (simulated devices share the cores: one device's matmul
    already runs on all of them). A mesh the caller set with ``jax.set_mesh``
    does not reach the matmul."""
    cpu = jax.devices("cpu")[0]
    matmul = jax.jit(jnp.matmul)
    out = {}
    with mesh_scope(None):
        for dtype in ("float32", "bfloat16"):
            a = jax.device_put(jnp.ones((PEAK_SIDE, PEAK_SIDE), dtype), cpu)
            matmul(a, a).block_until_ready()
            best = math.inf
            for _ in range(5):
                start = time.perf_counter()
                matmul(a, a).block_until_ready()
                best = min(best, time.perf_counter() - start)
            out[dtype] = 2 * PEAK_SIDE ** 3 / best / devices / 1e12
    return out


def _from_fits(fits: Mapping[str, Mapping[str, float]], peaks: Mapping[str, float],
               when: str, key: Mapping[str, Any], cache: Path) -> Profile:
    reduce = fits["all-reduce"]
    entry = {"alpha_us": reduce["alpha_us"], "busbw_GBps": reduce["busbw_GBps"],
             "kinds": {kind: dict(fit) for kind, fit in fits.items()}}
    source = (f"bench's alpha-beta fit per kind on {key['devices']} simulated CPU "
              f"devices of {key['host']} ({key['cpus']} CPUs, JAX {key['jax']}), "
              f"{when}; cached in {cache}")
    return profile_from(MEASURED, entry | {
        "source": source, "description": "this machine, measured",
        "chip": f"a simulated CPU device of {key['host']}", "peak_TFLOPs": peaks,
        "peak_source": f"a {PEAK_SIDE}-square matmul timed on one CPU device, "
                       f"divided by the {key['devices']} simulated devices that "
                       "share the cores"}, "measured")
