"""GPU execution with RAPIDS: what this machine has, and which stages run on the GPU.

A stage's mode is its own `gpu:` when the stage sets it, else `backends.<engine>.gpu`, else false
(`stage_mode`, the one place this rule lives):

- false: the CPU.
- auto:  the GPU when everything the engine needs is here (a visible NVIDIA GPU, and the RAPIDS
         packages or jar of that engine), else the CPU; the reason is recorded with the stage.
- true:  the GPU, or the run fails before any stage starts, naming what is missing.

What each engine needs on this machine is its own declaration (backends.Engine: gpu_packages,
attached_gpu_packages, gpu_plugin: a file it loads, such as Spark's RAPIDS jar). An engine attached
to a cluster runs its work on machines this one cannot probe: `true` trusts the cluster's GPUs and
checks only what this process needs (attached_gpu_packages, its plug-in), `auto` stays on the CPU.

Nothing here imports a RAPIDS package: detection uses nvidia-smi and importlib.util.find_spec.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..errors import ConfigError, UnavailableError
from ..installing import install_extras
from ..settings import byte_count

MEMORY_POOL = "rmm"  # RAPIDS' memory manager, whichever engine's stages allocated on the GPU
NO_GPU_HINT = "run on a machine with an NVIDIA GPU and driver, or use gpu: auto to fall back to the CPU"
QUERY = ("--query-gpu=index,uuid,name,memory.total,driver_version", "--format=csv,noheader,nounits")
SMI_TIMEOUT = 10.0  # seconds; a wedged driver must not hang the run


@dataclass(frozen=True)
class Device:
    index: int
    uuid: str
    name: str
    memory_mib: int
    driver: str


@dataclass(frozen=True)
class Probe:
    """What this process can use: the GPUs CUDA_VISIBLE_DEVICES leaves it, and the RAPIDS packages."""

    devices: tuple[Device, ...] = ()
    problem: str | None = None  # why no GPU is usable, when none is
    packages: dict[str, bool] = field(default_factory=dict)  # module -> importable


@dataclass(frozen=True)
class GpuChoice:
    use: bool
    reason: str
    mode: bool | str = False


@dataclass(frozen=True)
class EngineGpu:
    """What an engine started for GPU stages is given."""

    devices: tuple[Device, ...]
    plugin: Path | None = None  # the engine's GPU plug-in (backends.GpuPlugin), where it has one


# -- detection ----------------------------------------------------------------------------------

def parse_smi(text: str) -> list[Device]:
    """`nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version --format=csv,noheader,nounits`."""
    devices = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        index, uuid, name, memory, driver = parts
        devices.append(Device(int(index), uuid, name, int(float(memory.split()[0])), driver))
    return devices


def visible(devices: list[Device], env: str | None) -> list[Device]:
    """The devices CUDA_VISIBLE_DEVICES leaves visible, in its order. Like CUDA: unset means all,
    entries are indices or UUID prefixes (GPU-...), and the list ends at the first unknown entry."""
    if env is None:
        return list(devices)
    chosen: list[Device] = []
    for token in (t.strip() for t in env.split(",")):
        match = [d for d in devices if (token.isdigit() and d.index == int(token))
                 or (token.startswith(("GPU-", "MIG-")) and d.uuid.startswith(token))]
        if len(match) != 1 or match[0] in chosen:
            break
        chosen.append(match[0])
    return chosen


def rapids_packages() -> tuple[str, ...]:
    """Every RAPIDS package an engine declares it needs, and the memory pool."""
    from ..engines import engines

    declared = [name for e in engines().values() for name in (*e.gpu_packages, *e.attached_gpu_packages)]
    return tuple(dict.fromkeys([*declared, MEMORY_POOL]))


def packages() -> dict[str, bool]:
    """Which RAPIDS pieces are installed, found without importing them (importing cudf needs a GPU)."""
    return {name: importlib.util.find_spec(name) is not None for name in rapids_packages()}


def probe() -> Probe:
    """Ask nvidia-smi for the GPUs (absent binary: no driver); apply CUDA_VISIBLE_DEVICES."""
    found = packages()
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return Probe((), "no NVIDIA driver (nvidia-smi is not on PATH)", found)
    try:
        done = subprocess.run([smi, *QUERY], capture_output=True, text=True, timeout=SMI_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Probe((), f"nvidia-smi did not answer: {exc}", found)
    if done.returncode != 0:
        detail = (done.stdout.strip() or done.stderr.strip() or f"exit status {done.returncode}").splitlines()[0]
        return Probe((), f"nvidia-smi failed: {detail}", found)
    try:
        devices = parse_smi(done.stdout)
    except ValueError as exc:
        return Probe((), str(exc), found)
    if not devices:
        return Probe((), "nvidia-smi lists no GPU", found)
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = visible(devices, env)
    if not shown:
        hidden = "its only GPU" if len(devices) == 1 else f"all {len(devices)} GPUs"
        return Probe((), f"CUDA_VISIBLE_DEVICES={env!r} hides {hidden}", found)
    return Probe(tuple(shown), None, found)


# -- planning -----------------------------------------------------------------------------------

def stage_mode(pipeline, stage: str) -> bool | str:
    """The stage's own `gpu:` when it sets it, else its engine's `backends.<engine>.gpu`: what the
    stage asks for, which the fingerprint keeps and `plan` decides on."""
    spec = pipeline.stages[stage]
    if "gpu" in spec.model_fields_set:
        return spec.gpu
    return getattr(pipeline.engine_settings(spec.backend), "gpu", False)


def attached(pipeline, backend: str) -> bool:
    from ..engines import engine

    return engine(backend).attached(pipeline.engine_settings(backend))


def missing(backend: str, found: Probe, plugin: tuple[Path | None, str] | None,
            is_attached: bool) -> tuple[str, str] | None:
    """What keeps `backend` off the GPU here, as (what, how to fix it); None when nothing does.
    plugin: the engine's GPU plug-in as its finder answered (path or None, where it looked)."""
    if not is_attached and found.problem:
        return found.problem, NO_GPU_HINT
    from ..engines import engine

    info = engine(backend)
    if not info.gpu:
        return f"the {backend} backend has no GPU support", "set gpu: false for its stages"
    needed = info.attached_gpu_packages if is_attached else info.gpu_packages
    absent = [name for name in needed if not found.packages.get(name)]
    if absent:
        which = f"package {absent[0]} is" if len(absent) == 1 else f"packages {', '.join(absent)} are"
        return f"the RAPIDS {which} not installed", install_extras("gpu")
    if info.gpu_plugin is not None and plugin is not None and plugin[0] is None:
        return f"{info.gpu_plugin.name} was not found ({plugin[1]})", info.gpu_plugin.hint
    return None


@dataclass
class GpuPlan:
    """Each selected stage's choice, made once before any stage starts."""

    choices: dict[str, GpuChoice]
    backends: dict[str, str]  # stage -> backend
    found: Probe | None = None
    plugins: dict[str, Path | None] = field(default_factory=dict)  # backend -> its GPU plug-in found here
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage -> its params

    def engine(self, backend: str) -> EngineGpu | None:
        """GPU resources for an engine: given when any selected stage on it runs on the GPU
        (the engine is shared by its stages; the others switch the GPU off per stage)."""
        if not any(c.use for s, c in self.choices.items() if self.backends[s] == backend):
            return None
        return EngineGpu(self.found.devices if self.found else (), self.plugins.get(backend))

    def start_stage(self, stage: str, engine, engines: Iterable, log) -> tuple[bool | None, str | None]:
        """Before a stage runs: free what earlier stages left on the GPU, switch the engine to the
        stage's device. Returns what the run record keeps: (ran on the GPU, why), or (None, None)
        for a stage that never asked for the GPU."""
        for other in engines:
            if getattr(other, "gpu", None) is not None:
                other.release_gpu_memory()
        choice = self.choices.get(stage, GpuChoice(False, "gpu: false"))
        use = choice.use and getattr(engine, "gpu", None) is not None
        reason = choice.reason if use == choice.use else "the engine was started without GPU resources"
        engine.begin_stage(use, self.params.get(stage, {}), log)
        if choice.mode is False:
            return None, None
        log.info("device: %s (%s)", "GPU" if use else "CPU", reason)
        return use, reason


def plan(pipeline, stage_names: Iterable[str], found: Probe | None = None) -> GpuPlan:
    """Decide every selected stage's device. Raises UnavailableError for a `gpu: true` stage this
    machine cannot run on the GPU. Probes (nvidia-smi) only when some stage asks for a GPU."""
    names = list(stage_names)
    modes = {s: stage_mode(pipeline, s) for s in names}
    backends = {s: pipeline.stages[s].backend for s in names}
    result = GpuPlan({s: GpuChoice(False, "gpu: false") for s in names}, backends,
                     params={s: pipeline.params_for(s) for s in names})
    if not any(modes.values()):
        return result
    found = found or probe()
    from ..engines import engine

    plugins = {backend: engine(backend).gpu_plugin.find(pipeline.engine_settings(backend), pipeline.root)
               for backend in {backends[s] for s in names if modes[s]} if engine(backend).gpu_plugin is not None}
    result.found, result.plugins = found, {backend: where[0] for backend, where in plugins.items()}
    for stage in names:
        mode, backend = modes[stage], backends[stage]
        if not mode:
            continue
        is_attached = attached(pipeline, backend)
        problem = missing(backend, found, plugins.get(backend), is_attached)
        if mode is True and problem:
            raise UnavailableError(f"stage '{stage}' has gpu: true but {problem[0]}", hint=problem[1])
        if problem:
            result.choices[stage] = GpuChoice(False, f"auto: {problem[0]}", mode)
        elif mode == "auto" and is_attached:
            result.choices[stage] = GpuChoice(False, f"auto: the {backend} cluster's GPUs cannot be probed from "
                                                     "here (set gpu: true to use them)", mode)
        else:
            where = f"the {backend} cluster" if is_attached else _describe(found.devices)
            result.choices[stage] = GpuChoice(True, f"{'auto' if mode == 'auto' else 'gpu: true'}: {where}", mode)
    return result


def _describe(devices: tuple[Device, ...]) -> str:
    first = devices[0]
    more = f" (+{len(devices) - 1} more)" if len(devices) > 1 else ""
    return f"{first.name}, {first.memory_mib} MiB{more}"


# -- memory -------------------------------------------------------------------------------------

def parse_bytes(value: int | str) -> int:
    """'2GB', '512MiB', 1000000 -> bytes (the spellings dask and RMM accept)."""
    try:
        return byte_count(value)
    except ValueError as exc:
        raise ConfigError(str(exc), hint="write e.g. 2GB, 512MiB or a number of bytes") from None


def release_process_memory() -> None:
    """Free this process's unreferenced GPU memory: collect the frames earlier stages dropped, and
    hand a RAPIDS memory pool back to the device (the next stage may be another engine's process)."""
    gc.collect()
    rmm = sys.modules.get("rmm")
    if rmm is not None:
        rmm.reinitialize()  # the default allocator: the pool is freed once nothing refers to it


# -- doctor -------------------------------------------------------------------------------------

def cuda_version(smi_output: str) -> str | None:
    """The CUDA version the driver supports, from nvidia-smi's banner ('CUDA Version: 12.4')."""
    match = re.search(r"CUDA Version:\s*([\d.]+)", smi_output)
    return match.group(1) if match else None


def report(found: Probe | None = None, pipeline=None) -> list[tuple[str, str]]:
    """Rows for `hybridflow doctor`: the GPUs, their memory, the driver and CUDA versions, which
    RAPIDS pieces are importable, and where each engine's GPU plug-in is (as `pipeline` sets it)."""
    found = found or probe()
    rows: list[tuple[str, str]] = []
    if found.problem:
        rows.append(("GPU", f"none usable: {found.problem}"))
    for device in found.devices:
        rows.append((f"GPU {device.index}", f"{device.name}, {device.memory_mib:,} MiB"))
    if found.devices:
        rows.append(("NVIDIA driver", found.devices[0].driver))
        smi = shutil.which("nvidia-smi")
        try:
            banner = subprocess.run([smi], capture_output=True, text=True, timeout=SMI_TIMEOUT).stdout if smi else ""
        except (OSError, subprocess.TimeoutExpired):
            banner = ""
        rows.append(("CUDA (driver)", cuda_version(banner) or "unknown"))
    for name in rapids_packages():
        rows.append((name, "importable" if found.packages.get(name) else f"not installed ({install_extras('gpu')})"))
    from ..engines import engines

    for name, info in engines().items():
        if info.gpu_plugin is not None:
            settings = pipeline.engine_settings(name) if pipeline is not None else None
            path, where = info.gpu_plugin.find(settings, pipeline.root if pipeline is not None else None)
            rows.append((info.gpu_plugin.label, str(path) if path else f"not found: {where}"))
    return rows
