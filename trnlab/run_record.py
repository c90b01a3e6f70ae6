"""Which device and dtype produced a notebook's outputs: :func:`record_run` stores it with them (``trnlab.setup()``
calls it), :func:`stored_run` reads it back; ``trnlab.pytest_plugin`` compares a cell tagged ``device-dependent`` or
``dtype-dependent`` only in a run that matches. Torch-free: it never imports torch."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

from trnlab import __version__

__all__ = ["record_run", "stored_run", "describe_run", "CONSTRAINTS", "tested_versions", "newer_than_tested"]

#: The metadata key, of an output or of the notebook, that holds ``{"run": {...}}``: the record.
RECORD_KEY = "trnlab"
#: Packages whose versions a record names (absent ones are left out).
_PACKAGES = ("torch", "transformers", "torch-neuronx")


def _installed(name: str) -> str | None:
    """The installed distribution's version, None if absent (the stand-in's ``torch_neuronx`` module is none)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


#: The exact versions the stored notebooks and the suite were run with (``make`` installs them).
CONSTRAINTS = Path(__file__).with_name("constraints.txt")


def tested_versions() -> dict[str, str]:
    """``{package: version}`` of :data:`CONSTRAINTS`."""
    lines = (line.split("#")[0].strip() for line in CONSTRAINTS.read_text().splitlines())
    return dict(line.split("==") for line in lines if line)


def newer_than_tested(installed: dict[str, str | None] | None = None) -> list[str]:
    """One warning per package (of ``installed``, else this environment) newer than :data:`CONSTRAINTS` names."""
    from packaging.version import Version

    warnings = []
    for name, tested in tested_versions().items():
        version = installed.get(name) if installed is not None else _installed(name)
        if version and Version(Version(version).base_version) > Version(tested):
            warnings.append(f"{name} {version} is newer than {tested}, the version the course was tested with "
                            f"(trnlab/constraints.txt): if a cell fails, try pip install \"{name}=={tested}\"")
    return warnings


def _device_type(device) -> str:
    """``"neuron:0"``, ``torch.device("cuda", 1)``, ``"CPU"`` -> ``"neuron"``, ``"cuda"``, ``"cpu"``."""
    return str(getattr(device, "type", device)).strip().lower().partition(":")[0]


def _dtype_name(dtype) -> str:
    """``torch.bfloat16``, ``"torch.float32"``, ``"bfloat16"`` -> ``"bfloat16"``, ``"float32"``."""
    return str(dtype).strip().lower().removeprefix("torch.")


def _standin_active() -> bool:
    """Whether this process's ``neuron`` device is trnlab's STAND-IN (read from torch only if already imported)."""
    torch = sys.modules.get("torch")
    return bool(getattr(getattr(torch, "neuron", None), "standin", False))


def describe_run(record: dict) -> str:
    """``"neuron (STAND-IN), bfloat16"``: a record in words, as the plugin's report and :func:`record_run` say it."""
    device = _device_type(record.get("device", "?")) + (" (STAND-IN)" if record.get("standin") else "")
    return f"{device}, {_dtype_name(record.get('dtype', '?'))}"


def _in_kernel() -> bool:
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return getattr(shell, "kernel", None) is not None


def _record(device, dtype, model: str | None = None) -> dict:
    """What :func:`record_run` records: the device type (and whether it is trnlab's STAND-IN), the dtype, the model
    if given, and the versions of torch, transformers, torch-neuronx (where installed) and trnlab."""
    record = {"device": _device_type(device), "dtype": _dtype_name(dtype)}
    record["standin"] = record["device"] == "neuron" and _standin_active()
    if model is not None:
        record["model"] = str(model)
    record.update({package: version for package in _PACKAGES if (version := _installed(package))})
    record["trnlab"] = __version__
    return record


def record_run(device, dtype, model: str | None = None) -> None:
    """Record, with this cell's outputs, the device and dtype that produce this notebook's outputs.
    ``trnlab.setup()`` calls it; call it yourself where a notebook does not (``record_run(model.device, model.dtype)``).
    In a Jupyter kernel the record is the metadata of one line of output (nbval never compares metadata); elsewhere
    the line is printed. It holds the device type (and whether it is trnlab's STAND-IN), the dtype, the model if
    given, and the versions of torch, transformers, torch-neuronx and trnlab."""
    record = _record(device, dtype, model)
    text = f"run record for nbval: {describe_run(record)}"
    if _in_kernel():
        from IPython.display import publish_display_data

        publish_display_data({"text/plain": text}, metadata={RECORD_KEY: {"run": record}})
    else:
        print(text)


def _record_in(metadata) -> dict | None:
    run = (metadata or {}).get(RECORD_KEY, {})
    return run.get("run") if isinstance(run, dict) else None


def _output_record(output) -> dict | None:
    """The record an output carries in its metadata (:func:`record_run`'s line), else ``None``."""
    return _record_in(output.get("metadata")) if isinstance(output, dict) else None


def stored_run(notebook) -> dict | None:
    """The device and dtype that produced the stored outputs of ``notebook`` (a path, or a notebook as a dict).
    The first record :func:`record_run` stored in an output; else the notebook metadata's ``"trnlab": {"run": {...}}``,
    written by hand (``{"device": "neuron", "dtype": "bfloat16"}``, ``"standin": true`` for the stand-in); else
    ``None``. Device types and dtypes come back as :func:`record_run` writes them (``"neuron"``, ``"bfloat16"``)."""
    if isinstance(notebook, (str, Path)):
        notebook = json.loads(Path(notebook).read_text(encoding="utf-8"))
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            if (record := _output_record(output)) is not None:
                return dict(record)
    declared = _record_in(notebook.get("metadata"))
    if not isinstance(declared, dict) or "device" not in declared or "dtype" not in declared:
        return None
    return {**declared, "device": _device_type(declared["device"]), "dtype": _dtype_name(declared["dtype"]),
            "standin": bool(declared.get("standin", False))}
