"""What is usable on this machine, and the exact line that installs each missing piece (``mosaic doctor``).

Every check is real: tools are looked up and asked their version (:mod:`mosaic.toolchain`), modules are
imported, the GPU is queried through cuda-python (torch when cuda-python is absent), CUPTI is loaded.
Nothing here builds or launches a kernel.

What a kernel language needs is data (:data:`LANGUAGE_NEEDS`), keyed by the language's registered name, so
that core names the languages' Python packages without importing any plugin. A :class:`Check` is one
line of the report; :func:`diagnose` makes them all; :func:`find` picks the checks a ``--require`` names.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import os
import platform
import sys
from pathlib import Path

import attrs

from mosaic.toolchain.tools import find_tool, version_line, version_number

#: the CUDA tools, with the line that installs each from PyPI (nvcc and ptxas ship in one wheel)
#: (nvcc from PyPI needs crt, runtime, nvvm and, for CUTLASS, cccl beside it: with these five it builds CUTLASS
#: kernels for sm_90a)
PIP_NVCC = ("pip install 'nvidia-cuda-nvcc>=13,<14' 'nvidia-cuda-crt>=13,<14' 'nvidia-cuda-runtime>=13,<14' "
            "'nvidia-nvvm>=13,<14' 'nvidia-cuda-cccl>=13,<14'  # or a CUDA toolkit 12.3+ on PATH / in $CUDA_HOME")
TOOLS = {
    "nvcc": PIP_NVCC,
    "ptxas": "pip install 'nvidia-cuda-nvcc>=13,<14'  # or a CUDA toolkit 12.3+ on PATH / in $CUDA_HOME",
    "nvdisasm": "pip install 'nvidia-cuda-nvdisasm>=13,<14'",
    "cuobjdump": "pip install 'nvidia-cuda-cuobjdump>=13,<14'",
}
CUDA_PYTHON_FIX = "pip install 'mosaic-core[gpu]'  # cuda-python and cupti-python"
CUPTI_DRIVER_FIX = "# nothing to pip install: CUPTI needs the NVIDIA driver (libcuda.so.1) of a GPU machine"
CUPTI_FIX = "pip install 'cupti-python>=13.4,<13.5' 'nvidia-cuda-cupti>=13.4,<13.5'  # or: 'mosaic-core[gpu]'"


@attrs.frozen
class Module:
    """A Python module a language needs: imported for real, its distribution's version checked."""

    module: str
    distribution: str
    minimum: str | None = None
    below: str | None = None  # the first version known not to work
    python: tuple = (3, 11)  # the lowest Python its wheels exist for
    fix: str = ""  # the line that installs it

    def kind(self) -> str:
        return "module"


@attrs.frozen
class Headers:
    """C++ headers found through environment variables or a Python package that ships them.

    Mirrors ``mosaic_target_cutlass.build.cutlass_include`` (a test checks that both find the same place).
    """

    envs: tuple
    package: str  # a module whose directory holds ``subdir``
    subdir: str
    files: tuple  # paths that must exist, relative to the include directory
    version_header: str
    fix: str = ""

    def kind(self) -> str:
        return "headers"


@attrs.frozen
class LanguageNeeds:
    plugin: str  # the distribution that provides the language
    needs: tuple


LANGUAGE_NEEDS: dict[str, LanguageNeeds] = {
    "cute": LanguageNeeds(
        "mosaic-target-cute",
        (Module("cutlass.cute", "nvidia-cutlass-dsl", "4.8.1",
                fix="pip install 'nvidia-cutlass-dsl>=4.8.1,<5'  # on a CUDA 13 driver: 'nvidia-cutlass-dsl[cu13]'"),)),
    "pallas": LanguageNeeds(
        "mosaic-target-pallas",
        (Module("jax", "jax", "0.11.2", below="0.12", python=(3, 12),
                fix="pip install 'jax>=0.11.2,<0.12'  # on a GPU: 'jax[cuda13]>=0.11.2,<0.12'"),
         Module("jax.experimental.mosaic.gpu", "jaxlib", "0.11.2", below="0.12", python=(3, 12),
                fix="pip install 'jaxlib>=0.11.2,<0.12'"))),
    "cutlass": LanguageNeeds(
        "mosaic-target-cutlass",
        (Headers(("MOSAIC_CUTLASS_INCLUDE", "CUTLASS_INCLUDE"), "cutlass_library", "source/include",
                 ("cutlass/cutlass.h", "../tools/util/include/cutlass/util/packed_stride.hpp"),
                 "cutlass/version.h",
                 fix="pip install 'nvidia-cutlass==4.2.0.0'  # or export MOSAIC_CUTLASS_INCLUDE=<a CUTLASS "
                     "checkout>/include"),)),
}
PY312_FIX = "python3.12 -m venv .venv312  # jax >= 0.11.2 needs Python >= 3.12: run mosaic from there"


@attrs.frozen
class Check:
    """One line of the report: ``ok`` says whether the piece is usable; ``fix`` installs it when not."""

    section: str  # python | distribution | plugin | tool | gpu | cupti | language
    name: str
    ok: bool
    detail: str
    fix: str | None = None
    data: dict = attrs.field(factory=dict)

    def to_json(self) -> dict:
        return {"section": self.section, "name": self.name, "ok": self.ok, "detail": self.detail,
                "fix": self.fix, **({"data": self.data} if self.data else {})}


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _vtuple(text: str) -> tuple:
    out = []
    for part in text.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
        if not part.isdigit():
            break
    return tuple(out)


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}".rstrip(": ")


# -- Python and the mosaic distributions ----------------------------------------------------------------------
def python_check() -> Check:
    v = sys.version_info
    return Check("python", "python", v >= (3, 11), f"{platform.python_version()} at {sys.executable}",
                 None if v >= (3, 11) else "python3.12 -m venv .venv312  # mosaic needs Python >= 3.11",
                 {"version": platform.python_version(), "executable": sys.executable,
                  "implementation": platform.python_implementation()})


def distribution_checks() -> list[Check]:
    """Every installed distribution named ``mosaic-*``, with its version and where it was installed from."""
    seen: dict[str, Check] = {}
    for dist in md.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if not name.startswith("mosaic-") or name in seen:
            continue
        where = ""
        try:
            url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
            where = url.removeprefix("file://")
        except (OSError, ValueError):
            pass
        seen[name] = Check("distribution", name, True, f"{dist.version}" + (f" ({where})" if where else ""),
                           data={"version": dist.version, "location": where or None})
    return [seen[n] for n in sorted(seen)]


def _plugin_fix(name: str, distribution: str) -> str:
    if distribution in ("", "?"):
        return f"# repair or remove whatever declares the mosaic entry point '{name}'"
    return f"pip install --force-reinstall --no-deps {distribution}  # its plugin '{name}' does not load"


def plugin_checks(host=None) -> list[Check]:
    """Each loaded (or broken) plugin and what it registers: languages, GPUs, families, proposers."""
    if host is None:
        from mosaic.plugins import host as _host

        host = _host()
    provides: dict[str, dict[str, list[str]]] = {}
    for kind in ("languages", "gpus", "families", "proposers"):
        for name, reg in host.registries.get(kind, {}).items():
            provides.setdefault(reg.plugin, {}).setdefault(kind, []).append(name)
    out = []
    for name, info in sorted(host.plugins.items()):
        regs = {k: sorted(v) for k, v in sorted(provides.get(name, {}).items())}
        text = "; ".join(f"{k} {', '.join(v)}" for k, v in regs.items()) or "registers none of these"
        out.append(Check("plugin", name, info.loaded,
                         f"{info.distribution} {info.version}: {text}" if info.loaded else (info.error or "broken"),
                         None if info.loaded else _plugin_fix(name, info.distribution),
                         {"distribution": info.distribution, "version": info.version, **regs}))
    return out


# -- the CUDA toolchain ---------------------------------------------------------------------------------------
def tool_check(name: str) -> Check:
    exe = find_tool(name)
    if exe is None:
        return Check("tool", name, False, "not found (PATH, CUDA_HOME, /usr/local/cuda, pip nvidia wheels)",
                     TOOLS[name])
    try:
        version = version_number(exe)
        line = version_line(exe)
    except Exception as exc:  # noqa: BLE001 - a tool that cannot run is reported, not raised
        return Check("tool", name, False, f"{exe} does not run: {_why(exc)}", TOOLS[name], {"path": exe})
    if version is None:
        return Check("tool", name, False, f"{exe}: --version says no version ({line})", TOOLS[name], {"path": exe})
    return Check("tool", name, True, f"{version} at {exe}", data={"path": exe, "version": version, "build": line})


# -- the GPU and CUPTI ----------------------------------------------------------------------------------------
def _cuda_python_devices() -> tuple[list[dict] | None, str, str | None]:
    """(devices or None when cuda-python is missing, reason when none, driver version)."""
    try:
        from cuda.bindings import driver, runtime  # type: ignore[import-not-found]
    except ImportError:
        return None, "cuda-python is not installed", None
    driver_version = None
    try:
        err, ver = driver.cuDriverGetVersion()
        if int(err) == 0 and ver:
            driver_version = f"CUDA {ver // 1000}.{ver % 1000 // 10}"
    except Exception:  # noqa: BLE001 - no libcuda: reported as no driver below
        pass
    try:
        err, count = runtime.cudaGetDeviceCount()
    except Exception as exc:  # noqa: BLE001 - a cuda-python that cannot load the runtime
        return [], f"cuda-python cannot query devices: {_why(exc)}", driver_version
    if int(err) != 0 or not count:
        return [], f"no CUDA device visible ({err!s})".replace("<", "").replace(">", ""), driver_version
    devices = []
    for index in range(count):
        err, prop = runtime.cudaGetDeviceProperties(index)
        if int(err) != 0:
            return devices, f"cudaGetDeviceProperties({index}) failed: {err!s}", driver_version
        name = (prop.name.decode() if isinstance(prop.name, bytes) else str(prop.name)).rstrip("\x00")
        devices.append({"index": index, "name": name, "compute_capability": [prop.major, prop.minor],
                        "sm_count": prop.multiProcessorCount, "memory_bytes": int(prop.totalGlobalMem)})
    return devices, "", driver_version


def _torch_devices() -> tuple[list[dict] | None, str]:
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return [], f"torch {torch.__version__} sees no CUDA device"
    out = []
    for index in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(index)
        out.append({"index": index, "name": p.name, "compute_capability": [p.major, p.minor],
                    "sm_count": p.multi_processor_count, "memory_bytes": int(p.total_memory)})
    return out, ""


def gpu_checks(targets=None) -> list[Check]:
    """One check per visible device (matched against the registered GPU records), or one saying "none"."""
    devices, reason, driver_version = _cuda_python_devices()
    via = "cuda-python"
    if devices is None:
        devices, torch_reason = _torch_devices()
        via = "torch"
        reason = f"{reason}; {torch_reason}" if devices is None or not devices else reason
        if devices is None:
            return [Check("gpu", "gpu", False, f"none: {reason}", CUDA_PYTHON_FIX)]
    if not devices:
        return [Check("gpu", "gpu", False, f"none: {reason}" + (f"; driver {driver_version}" if driver_version
                                                                   else "; no NVIDIA driver answers"),
                      "# nothing to install: this needs an NVIDIA GPU and its driver",
                      {"via": via, "driver": driver_version})]
    if targets is None:
        from mosaic.plugins import host

        targets = host().items("gpus").values()
    targets = list(targets)
    out = []
    for d in devices:
        cc = tuple(d["compute_capability"])
        match = next((t for t in targets if t.matches(d["name"], cc, d["sm_count"])), None)
        detail = (f"{d['name']}, sm_{cc[0]}{cc[1]}, {d['sm_count']} SMs, {d['memory_bytes'] / 2**30:.0f} GiB"
                  + (f", driver {driver_version}" if driver_version else "")
                  + (f", record '{match.name}'" if match else ", no registered GPU record"))
        out.append(Check("gpu", f"gpu{d['index']}", True, detail,
                         None if match else "pip install mosaic-gpu-hopper  # or mosaic-gpu-blackwell: the device's GpuTarget record",
                         {**d, "via": via, "driver": driver_version, "record": match.name if match else None}))
    return out


def cupti_check() -> Check:
    """cupti-python imports and its CUPTI library loads and answers (``cuptiGetTimestamp``; loading needs the
    NVIDIA driver's libcuda, kernel records need a GPU)."""
    version = _version("cupti-python")
    try:
        from cupti import cupti  # type: ignore[import-not-found]
    except Exception as exc:  # noqa: BLE001 - missing, or its extension fails to load
        missing = isinstance(exc, ImportError) and version is None
        return Check("cupti", "cupti", False, "cupti-python is not installed" if missing
                     else f"cupti-python {version} does not import: {_why(exc)}", CUPTI_FIX)
    try:
        stamp = int(cupti.get_timestamp())
    except Exception as exc:  # noqa: BLE001 - no driver, or a CUPTI older than the driver
        why = _why(exc)
        fix = (CUPTI_DRIVER_FIX if "driver" in why.lower() else CUPTI_FIX)
        return Check("cupti", "cupti", False, f"cupti-python {version} imports but CUPTI does not load: {why}",
                     fix, {"version": version})
    return Check("cupti", "cupti", True, f"cupti-python {version}, CUPTI loaded (timestamp {stamp} ns)",
                 data={"version": version, "timestamp_ns": stamp})


# -- the languages --------------------------------------------------------------------------------------------
def _module_problem(need: Module) -> tuple[str | None, str]:
    """(problem or None, what was found)."""
    if sys.version_info[:2] < need.python:
        return (f"{need.distribution} {need.minimum or ''} needs Python >= {'.'.join(map(str, need.python))} "
                f"(this is {platform.python_version()})").replace("  ", " "), ""
    version = _version(need.distribution)
    if version is None:
        return f"{need.distribution} is not installed", ""
    if need.minimum and _vtuple(version) < _vtuple(need.minimum):
        return f"{need.distribution} {version} is older than {need.minimum}", version
    if need.below and _vtuple(version) >= _vtuple(need.below):
        return f"{need.distribution} {version} is not supported (needs < {need.below})", version
    try:
        importlib.import_module(need.module)
    except Exception as exc:  # noqa: BLE001 - any import failure makes the language unusable here
        return f"import {need.module} failed: {_why(exc)}", version
    return None, f"{need.distribution} {version}"


def header_location(need: Headers) -> tuple[Path | None, str]:
    """(include directory or None, how it was found or why not)."""
    for env in need.envs:
        if os.environ.get(env):
            inc, how = Path(os.environ[env]), f"${env}"
            break
    else:
        try:
            pkg = importlib.import_module(need.package)
        except ImportError:
            return None, f"no ${need.envs[0]} and {need.package} is not installed"
        inc, how = Path(pkg.__file__).parent / need.subdir, need.package
    for rel in need.files:
        if not (inc / rel).is_file():
            return None, f"no {os.path.normpath(inc / rel)} (from {how})"
    return inc, how


def _header_problem(need: Headers) -> tuple[str | None, str]:
    inc, how = header_location(need)
    if inc is None:
        return how, ""
    version = "?"
    try:
        text = (inc / need.version_header).read_text()
        nums = []
        for part in ("MAJOR", "MINOR", "PATCH"):
            tag = f"#define CUTLASS_{part} "
            line = next((ln for ln in text.splitlines() if ln.startswith(tag)), "")
            nums.append(line[len(tag):].strip() or "?")
        version = ".".join(nums)
    except OSError:
        pass
    return None, f"headers {version} at {inc} (from {how})"


def language_checks(host=None) -> list[Check]:
    """Each registered language, and each known one whose plugin is not installed, with its readiness."""
    if host is None:
        from mosaic.plugins import host as _host

        host = _host()
    registered = host.registries.get("languages", {})
    out = []
    for name in sorted(set(registered) | set(LANGUAGE_NEEDS)):
        needs = LANGUAGE_NEEDS.get(name)
        if name not in registered:
            out.append(Check("language", name, False, f"plugin not installed ({needs.plugin})",
                             f"pip install {needs.plugin}  # from this repository: pip install "
                             f"./packages/{needs.plugin.removeprefix('mosaic-')}"))
            continue
        plugin = registered[name].plugin
        if needs is None:
            out.append(Check("language", name, True, f"from plugin '{plugin}'; no readiness rule in mosaic.doctor",
                             data={"plugin": plugin}))
            continue
        problems, found, fixes = [], [], []
        for need in needs.needs:
            problem, what = _header_problem(need) if isinstance(need, Headers) else _module_problem(need)
            if problem:
                problems.append(problem)
                fixes.append(PY312_FIX if "needs Python" in problem else need.fix)
                if "needs Python" in problem:
                    break  # the rest cannot be installed into this interpreter either
            if what:
                found.append(what)
        detail = "; ".join(problems) if problems else ", ".join(found)
        out.append(Check("language", name, not problems, detail, "\n".join(fixes) or None,
                         {"plugin": plugin, "found": found, "problems": problems}))
    return out


# -- optional packages ----------------------------------------------------------------------------------------
#: packages some features use when installed: distribution -> (what for, the line that installs it)
OPTIONAL = {
    "torch": ("the torch/cuBLAS/SDPA yardsticks, CuTe device memory, AMK", "pip install 'torch>=2.4'"),
    "ray": ("mosaic run --executor ray", "pip install ray"),
    "mcp": ("mosaic mcp (a campaign served to coding agents)", "pip install mcp"),
    "rich": ("progress bars (mosaic.progress; else tqdm, else plain lines)", "pip install 'mosaic-core[progress]'"),
    "tqdm": ("progress bars when rich is absent", "pip install tqdm"),
    "cupy-cuda13x": ("the AMK CUDA VM's launches", "pip install 'mosaic-amk[gpu]'  # cupy-cuda13x, a CUDA 13 driver"),
}


def optional_checks() -> list[Check]:
    """Whether each optional package is installed (its metadata; nothing is imported) and what it is for."""
    out = []
    for dist, (purpose, fix) in OPTIONAL.items():
        version = _version(dist)
        out.append(Check("optional", dist, version is not None,
                         f"{version}: {purpose}" if version else f"not installed: {purpose}",
                         None if version else fix, {"version": version}))
    return out


# -- the whole report -----------------------------------------------------------------------------------------
SECTIONS = ("python", "distribution", "plugin", "tool", "gpu", "cupti", "language", "optional")


def diagnose(host=None) -> list[Check]:
    """Every check, in report order."""
    if host is None:
        from mosaic.plugins import host as _host

        host = _host()
    steps = [("python", python_check), ("distribution", distribution_checks), ("plugin", lambda: plugin_checks(host)),
             *((("tool", t), lambda t=t: tool_check(t)) for t in TOOLS),
             ("gpu", lambda: gpu_checks(host.items("gpus").values())), ("cupti", cupti_check),
             ("language", lambda: language_checks(host)), ("optional", optional_checks)]
    out: list[Check] = []
    for what, step in steps:
        section, name = what if isinstance(what, tuple) else (what, what)
        try:
            got = step()
        except Exception as exc:  # noqa: BLE001 - the report goes on; the broken check says why
            got = Check(section, name, False, f"the check itself failed: {_why(exc)}",
                        "# a bug in mosaic.doctor: please report this line")
        out += [got] if isinstance(got, Check) else got
    return out


#: what ``--require`` accepts besides a tool, plugin or language name
REQUIRE_SECTIONS = {"gpu": "gpu", "cupti": "cupti", "tools": "tool", "toolchain": "tool"}


def requirable(checks: list[Check]) -> list[str]:
    names = {c.name for c in checks if c.section in ("tool", "language", "plugin", "optional")}
    return sorted(names | set(REQUIRE_SECTIONS))


def find(checks: list[Check], what: str) -> list[Check] | None:
    """The checks ``--require what`` stands for (None when it names nothing): ``gpu`` any device, ``cupti``,
    ``tools`` all four tools, or one tool / language / plugin by name (a name both a language and a plugin
    have means the language)."""
    if what in REQUIRE_SECTIONS:
        return [c for c in checks if c.section == REQUIRE_SECTIONS[what]]
    for section in ("tool", "language", "plugin", "optional"):
        found = [c for c in checks if c.section == section and c.name == what]
        if found:
            return found
    return None


def satisfied(found: list[Check], what: str) -> bool:
    if what == "gpu":
        return any(c.ok for c in found)
    return bool(found) and all(c.ok for c in found)


def missing_fixes(checks: list[Check]) -> list[str]:
    """The install lines for everything not usable, each once, in report order (optional packages excluded)."""
    out: list[str] = []
    for c in checks:
        for line in (c.fix or "").splitlines() if not c.ok and c.section != "optional" else ():
            if line not in out:
                out.append(line)
    return out


__all__ = ["Check", "Headers", "LANGUAGE_NEEDS", "LanguageNeeds", "Module", "OPTIONAL", "SECTIONS", "TOOLS",
           "cupti_check", "diagnose", "distribution_checks", "find", "gpu_checks", "header_location",
           "language_checks", "missing_fixes", "optional_checks", "plugin_checks", "python_check", "requirable",
           "satisfied", "tool_check"]
