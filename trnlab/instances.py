"""The Trainium instances the planner and the launcher know: chips, HBM and NeuronCores, from the Neuron docs.
Adding one is an :class:`Instance` line in :data:`INSTANCES` with its doc URL (single trn3 sizes: the docs give none)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "GiB",
    "PlanError",
    "InstanceError",
    "Instance",
    "INSTANCES",
    "UNSUPPORTED_INSTANCES",
    "get_instance",
    "TRN2_ARCH_URL",
    "TRAINIUM2_URL",
    "TRN3_ARCH_URL",
    "TRAINIUM3_URL",
    "LNC_URL",
    "TORCHNEURON_QUICKSTART_URL",
]

#: Bytes in one gibibyte (2**30): every GiB figure of the instance table and the planner.
GiB = 1024 ** 3


class PlanError(ValueError):
    """A plan that cannot be made; the message says what to change.
    An unknown instance or model, a mesh the model cannot take, a config missing fields, or a workload no mesh fits."""


class InstanceError(PlanError):
    """An instance name the planner does not know, or one the native ``neuron`` device does not run on."""


#: Where the trn2 instance figures come from (Neuron docs: trn2 architecture).
TRN2_ARCH_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trn2-arch.html"
#: The Trainium2 chip page (Neuron docs): HBM and NeuronCores per chip.
TRAINIUM2_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trainium2.html"
#: Where the trn3 instance figures come from (Neuron docs: trn3 architecture).
TRN3_ARCH_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/trn3-arch.html"
#: The Trainium3 chip page (Neuron docs): HBM and NeuronCores per chip.
TRAINIUM3_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/trainium3.html"
#: Logical NeuronCore configuration (Neuron docs): physical cores per logical core.
LNC_URL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-features/logical-neuroncore-config.html"
#: The TorchNeuron quickstart (Neuron docs): the native ``neuron`` device.
TORCHNEURON_QUICKSTART_URL = ("https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/get-started/"
                              "quickstart-torch-neuron.html")


@dataclass(frozen=True)
class Instance:
    """One Trainium machine (or UltraServer) as the planner sees it; ``hosts`` is its number of torchrun nodes.
    ``logical_cores`` = chips x physical NeuronCores per chip / LNC, one rank each; ``hbm_per_core`` is the chip's HBM
    split between them, before runtime overhead (docs: "approximately 24 GiB of HBM per rank" on trn2)."""

    name: str
    family: str                    # "trn2" or "trn3"
    chips: int
    hbm_per_chip_gib: int
    physical_cores_per_chip: int = 8
    lnc: int = 2                   # NEURON_LOGICAL_NC_CONFIG default on Trn2 and later
    hosts: int = 1
    source: str = ""

    @property
    def cores_per_chip(self) -> int:
        return self.physical_cores_per_chip // self.lnc

    @property
    def logical_cores(self) -> int:
        return self.chips * self.cores_per_chip

    @property
    def cores_per_host(self) -> int:
        return self.logical_cores // self.hosts

    @property
    def hbm_per_core(self) -> int:
        """Bytes of HBM per logical NeuronCore."""
        return self.hbm_per_chip_gib * GiB // self.cores_per_chip

    @property
    def hbm_total(self) -> int:
        return self.hbm_per_chip_gib * GiB * self.chips

    def to_dict(self) -> dict:
        return {"name": self.name, "family": self.family, "chips": self.chips,
                "hbm_per_chip_gib": self.hbm_per_chip_gib, "lnc": self.lnc, "hosts": self.hosts,
                "logical_cores": self.logical_cores, "cores_per_host": self.cores_per_host,
                "hbm_per_core_bytes": self.hbm_per_core, "hbm_total_bytes": self.hbm_total,
                "source": self.source}


#: Instances the native ``neuron`` device supports; each row's ``source`` is its Neuron docs page. Per chip:
#: Trainium2 8 NeuronCore-v3, 96 GiB; Trainium3 8 NeuronCore-v4, 144 GiB; LNC=2 gives 4 logical cores (LNC_URL).
INSTANCES: dict[str, Instance] = {inst.name: inst for inst in (
    Instance("trn2.3xlarge", "trn2", chips=1, hbm_per_chip_gib=96, source=TORCHNEURON_QUICKSTART_URL),
    Instance("trn2.48xlarge", "trn2", chips=16, hbm_per_chip_gib=96, source=TRN2_ARCH_URL),
    Instance("trn2u.48xlarge", "trn2", chips=16, hbm_per_chip_gib=96, source=TRN2_ARCH_URL),
    Instance("trn2-ultraserver", "trn2", chips=64, hbm_per_chip_gib=96, hosts=4, source=TRN2_ARCH_URL),
    Instance("trn3-gen1-ultraserver", "trn3", chips=64, hbm_per_chip_gib=144, hosts=4, source=TRN3_ARCH_URL),
    Instance("trn3-gen2-ultraserver", "trn3", chips=144, hbm_per_chip_gib=144, hosts=36, source=TRN3_ARCH_URL),
)}

#: Known Trainium instances the native ``neuron`` device does not run on, and why.
UNSUPPORTED_INSTANCES: dict[str, str] = {
    name: ("trn1 (Trainium, 2 NeuronCore-v2 and 32 GiB per chip) has no native `neuron` device: "
           "TorchNeuron supports trn2 and trn3 only, and trn1 keeps the older XLA-based torch-neuronx "
           "(torch-xla, neuron_parallel_compile). This course and planner target trn2/trn3: use e.g. "
           "trn2.48xlarge.")
    for name in ("trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge")
}


def get_instance(name: str | Instance) -> Instance:
    """The :class:`Instance` called ``name`` (e.g. ``"trn2.48xlarge"``), from :data:`INSTANCES`.
    Raises :class:`InstanceError` (a :class:`PlanError`) for trn1, saying why, and for unknown names, listing the rest."""
    if isinstance(name, Instance):
        return name
    key = str(name).strip().lower()
    if key in INSTANCES:
        return INSTANCES[key]
    if key in UNSUPPORTED_INSTANCES or key.startswith(("trn1.", "trn1n.")):
        raise InstanceError(f"{name}: {UNSUPPORTED_INSTANCES.get(key, UNSUPPORTED_INSTANCES['trn1.32xlarge'])}")
    raise InstanceError(f"unknown instance {name!r}: use one of {', '.join(INSTANCES)} "
                        f"(figures from the Neuron docs; trn1 is not supported by the native neuron device).")
