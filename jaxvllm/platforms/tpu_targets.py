"""TPU slices by name (`tpu-v5e-8`), with each chip's published figures, and compile-only
devices for them: libtpu (the `tpu` extra) compiles for a topology on any machine, no TPU
attached (`jax.experimental.topologies`), so that a program's Mosaic kernels, memory and cost
are known before a chip is rented.

Chip figures are Google Cloud's published per-chip peaks (bfloat16 dense matmul, HBM capacity
and bandwidth), used for roofline predictions, which are not measurements. A slice named by
chips (v5e, v6e) or, for v5p, by TensorCores (two per chip) as Cloud names them.
"""
from __future__ import annotations

import dataclasses

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
    generation: str           # jax topology prefix: "v5e", "v6e", "v5p"
    device_kind: str          # what a device of it calls itself
    hbm_bytes: int
    hbm_bytes_per_s: float
    peak_flops: float         # bfloat16 dense
    host_topology: str        # the smallest topology libtpu builds (1x1 is refused): one host


CHIPS = {
    "v5e": Chip("v5e", "TPU v5 lite", 16 * GiB, 819e9, 197e12, "2x2"),
    "v6e": Chip("v6e", "TPU v6 lite", 32 * GiB, 1640e9, 918e12, "2x2"),
    "v5p": Chip("v5p", "TPU v5", 95 * GiB, 2765e9, 459e12, "2x2x1"),
}


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    chip: Chip
    num_chips: int
    topology: str  # a topology holding at least num_chips chips

    def devices(self) -> list:
        """num_chips compile-only devices of this slice (libtpu needed; nothing is attached)."""
        try:
            from jax.experimental import topologies
            found = topologies.get_topology_desc(topology_name=f"{self.chip.generation}:{self.topology}",
                                                 platform="tpu").devices
        except Exception as e:  # no libtpu, or a jax that cannot build this topology
            raise RuntimeError(f"Cannot build compile-only devices for {self.name} ({e}); install "
                               "the tpu extra: pip install 'jaxvllm[tpu]'.") from e
        return list(found)[:self.num_chips]


def _targets() -> dict[str, Target]:
    slices = {"v5e": [(1, "2x2"), (4, "2x2"), (8, "2x4"), (16, "4x4")],
              "v6e": [(1, "2x2"), (4, "2x2"), (8, "2x4"), (16, "4x4")],
              "v5p": [(4, "2x2x1"), (8, "2x2x2")]}
    out = {}
    for gen, sizes in slices.items():
        for chips, topology in sizes:
            cores = chips * 2 if gen == "v5p" else chips
            out[f"tpu-{gen}-{cores}"] = Target(f"tpu-{gen}-{cores}", CHIPS[gen], chips, topology)
    return out


TARGETS = _targets()


def get_target(name: str) -> Target:
    if name not in TARGETS:
        raise ValueError(f"Unknown target {name!r}; known targets: {', '.join(TARGETS)}.")
    return TARGETS[name]
