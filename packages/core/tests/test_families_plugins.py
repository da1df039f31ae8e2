"""A third-party kernel family, registered by a plugin through ``register_families`` (the hook core's own
families use): it joins the registry, `mosaic families` lists it, and `mosaic capture --family` generates its
inputs; two plugins registering one name, or a plugin re-registering a built-in, is one clear error line.

The plugins are real distributions written to a temporary directory (dist-info with a ``mosaic`` entry
point), loaded by the plugin host in-process and, through PYTHONPATH, by the `mosaic` command and its capture
child."""

import importlib.metadata as md
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from mosaic import plugins
from mosaic.errors import BadInput, PluginError
from mosaic.families import make_inputs, parse_shape, physical_floor_ns, providers, registry
from mosaic.plugins import PluginHost
from mosaic.records import KernelSpec

MOSAIC = str(Path(sys.executable).parent / "mosaic")

DOUBLER = '''
import attrs
import numpy as np

from mosaic.backend import Lowered
from mosaic.oracle.builtin import Family as Reference
from mosaic.oracle.verdict import Expectation
from mosaic.plugins import hookimpl
from mosaic.records import Family, Language, Oracle


def work(shape, e):
    n = shape["rows"] * shape["cols"]
    return float(n), 2.0 * e * n


def make_inputs(shape, dtype, seed, values):
    from mosaic.oracle.formats import fmt

    rng = np.random.default_rng(seed)
    size = (shape["rows"], shape["cols"])
    if values == "int":
        return {"x": rng.integers(-8, 9, size=size).astype(np.float32)}
    return {"x": fmt(dtype).round(rng.standard_normal(size) / 2).astype(np.float32)}  # "halves"


def reference(inputs, in_fmt, out_fmt):
    ref = 2.0 * inputs["x"].astype(np.float64)
    return {"y": Expectation(ref, np.zeros_like(ref), out_fmt, "y = 2x, exactly")}


@attrs.frozen
class NoKnobs:
    pass


class Doubled:
    def __init__(self, inputs):
        self.x, self.y = inputs["x"], None

    def launch(self):
        self.y = 2 * self.x

    def poison(self):
        self.y = np.full_like(self.x, np.nan)

    def output(self):
        return {"y": self.y}

    def close(self):
        pass


class Backend:
    def knobs(self, family):
        return NoKnobs

    def lower(self, spec, gpu, workdir):
        return Lowered(kernel_name="double")

    def prepare(self, spec, gpu, workdir, inputs):
        return Doubled(inputs)


DOUBLE = Family("double", "y = 2 x", ("rows", "cols"), work, floor="e*2*rows*cols / bandwidth",
                dtypes=("bf16", "f16"), distributions=("int", "halves"), make_inputs=make_inputs)
NOGEN = Family("nogen", "a family without an input generator", ("n",), lambda shape, e: (0.0, 0.0))


@hookimpl
def register_families(register):
    register(DOUBLE)
    register(NOGEN)


@hookimpl
def register_oracles(register):
    register(Oracle("double", "y = 2x, float64", Reference("double", ("x",), (), ("y",), reference, "exact")))


@hookimpl
def register_languages(register):
    register(Language(name="doubler", summary="doubles its input (a CPU test language)",
                      families=("double", "nogen"), backend=Backend()))
'''

SAME_NAME = '''
from mosaic.plugins import hookimpl
from mosaic.records import Family


@hookimpl
def register_families(register):
    register(Family("{name}", "another family of this name", ("n",), lambda shape, e: (0.0, 0.0)))
'''


@pytest.fixture
def distdir(tmp_path, monkeypatch):
    """Write distributions into tmp_path; return (add, eps, env)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    created = []

    def add(dist: str, ep_name: str, source: str):
        module = f"plug_{dist.replace('-', '_')}"
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        info = tmp_path / f"{dist.replace('-', '_')}-1.0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0.0\n")
        (info / "entry_points.txt").write_text(f"[mosaic]\n{ep_name} = {module}\n")
        created.append(module)

    def eps():
        return [ep for d in md.distributions(path=[str(tmp_path)]) for ep in d.entry_points if ep.group == "mosaic"]

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    env.pop("MOSAIC_DEBUG", None)
    yield add, eps, env
    for m in created:
        sys.modules.pop(m, None)


def use(host: PluginHost, monkeypatch) -> None:
    monkeypatch.setattr(plugins, "_HOST", host.load())


def test_a_plugin_family_joins_the_registry_with_its_generator_and_floor(distdir, monkeypatch):
    add, eps, _ = distdir
    add("acme-families", "acme", DOUBLER)
    use(PluginHost(eps()), monkeypatch)
    assert {"gemm", "attention", "rmsnorm", "softmax", "double", "nogen"} <= set(registry())
    assert providers()["double"] == "acme-families" and providers()["gemm"] == "mosaic-core"
    assert parse_shape("double", "4x8") == {"rows": 4, "cols": 8}
    spec = KernelSpec("double", {"rows": 4, "cols": 8}, "bf16", "doubler")
    x = make_inputs(spec, 3, "halves")["x"]
    assert x.shape == (4, 8) and np.array_equal(x, make_inputs(spec, 3, "halves")["x"])

    class Gpu:
        peak_bf16_tflops, peak_fp8_tflops, hbm_bandwidth_gbs = 1000.0, 2000.0, 4000.0

    assert physical_floor_ns("double", {"rows": 1000, "cols": 1000}, "bf16", Gpu()) == pytest.approx(4e6 / 4e12 * 1e9)


def test_a_family_without_a_generator_is_refused_by_name(distdir, monkeypatch):
    add, eps, _ = distdir
    add("acme-families", "acme", DOUBLER)
    use(PluginHost(eps()), monkeypatch)
    with pytest.raises(BadInput, match="no input generator for family 'nogen'"):
        make_inputs(KernelSpec("nogen", {"n": 4}, "bf16", "doubler"), 0, "normal")
    with pytest.raises(BadInput, match="family 'double' has no value distribution 'normal'; it has: int, halves"):
        make_inputs(KernelSpec("double", {"rows": 4, "cols": 8}, "bf16", "doubler"), 0, "normal")


def test_two_plugins_registering_one_family_name_are_one_error(distdir):
    add, eps, _ = distdir
    add("first-dist", "first", SAME_NAME.format(name="dup"))
    add("second-dist", "second", SAME_NAME.format(name="dup"))
    with pytest.raises(PluginError, match="^family 'dup' is registered by both first-dist and second-dist$"):
        PluginHost(eps()).load()


def test_a_plugin_may_not_register_a_builtin_family_again(distdir, monkeypatch):
    add, eps, _ = distdir
    add("rival-dist", "rival", SAME_NAME.format(name="gemm"))
    use(PluginHost(eps()), monkeypatch)
    with pytest.raises(PluginError, match="family 'gemm' is built into mosaic-core and registered again by rival-dist"):
        registry()


def run(env, *args, cwd=None):
    return subprocess.run([MOSAIC, *args], capture_output=True, text=True, env=env, timeout=300, cwd=cwd)


def test_mosaic_families_lists_a_plugin_family(distdir):
    add, _, env = distdir
    add("acme-families", "acme", DOUBLER)
    done = run(env, "families", "--json")
    assert done.returncode == 0, done.stderr
    fams = {f["name"]: f for f in json.loads(done.stdout)["families"]}
    assert fams["double"]["provided_by"] == "acme-families" and fams["double"]["dims"] == ["rows", "cols"]
    assert list(fams["double"]["distributions"]) == ["int", "halves"] and fams["double"]["oracle"]["registered"]
    assert fams["nogen"]["inputs"] is False and fams["nogen"]["oracle"]["registered"] is False
    assert fams["attention"]["optional_dims"].keys() == {"kv_heads", "causal"}
    assert [y["name"] for y in fams["attention"]["yardsticks"]] == ["torch-sdpa", "sdpa-flash", "cudnn",
                                                                            "flash-attn-4"]
    table = run(env, "families")
    assert table.returncode == 0
    rows = {line.split()[0]: line for line in table.stdout.splitlines()[2:]}
    assert "acme-families" in rows["double"] and "int,halves" in rows["double"] and "(no generator)" in rows["nogen"]
    assert "cublas" in rows["gemm"] and "max(2*m*n*k / peak" in rows["gemm"]
    assert "family:double" in run(env, "plugins", "--json").stdout


def test_mosaic_capture_generates_a_plugin_familys_inputs(distdir, tmp_path, monkeypatch):
    add, eps, env = distdir
    add("acme-families", "acme", DOUBLER)
    out = tmp_path / "d.bundle"
    done = run(env, "capture", "--lang", "doubler", "--family", "double", "--shape", "6x16", "--dtype", "bf16",
               "--values", "halves", "--seed", "11", "--blocks", "1", "--runs", "1", "--timeout", "120", "-o", str(out))
    assert "Traceback" not in done.stderr
    use(PluginHost(eps()), monkeypatch)
    want = make_inputs(KernelSpec("double", {"rows": 6, "cols": 16}, "bf16", "doubler"), 11, "halves")
    with np.load(out / "inputs.npz", allow_pickle=False) as got:
        assert set(got.files) == {"x"} and np.array_equal(got["x"], want["x"])
    meta = json.loads((out / "inputs-meta.json").read_text())
    assert meta["seed"] == 11 and meta["values"] == "halves"
    log = (out / "capture.log").read_text()
    assert "lowered in" in log and "oracle: pass" in log  # the plugin's backend ran it, its oracle checked it
    # (timing then needs a CUDA device: without one the capture ends there and says so)
    assert done.returncode == 0 or "cuda" in log.lower() or "cupti" in log.lower(), log


@pytest.mark.parametrize("args, needle", [
    (["--family", "nogen", "--shape", "5"], "no input generator for family 'nogen'"),
    (["--family", "double", "--shape", "4x8", "--values", "normal"],
     "family 'double' has no value distribution 'normal'; it has: int, halves"),
    (["--family", "double", "--shape", "4x8", "--dtype", "f32", "--values", "int"],
     "generates inputs in bf16, f16, not f32"),
])
def test_capture_refuses_what_a_family_cannot_generate_in_one_line(distdir, tmp_path, args, needle):
    add, _, env = distdir
    add("acme-families", "acme", DOUBLER)
    base = {"--dtype": "bf16"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    flat = [x for kv in base.items() for x in kv]
    done = run(env, "capture", "--lang", "doubler", *flat, "-o", str(tmp_path / "x.bundle"))
    assert done.returncode == 2 and needle in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "x.bundle").exists()


def test_duplicate_family_names_stop_the_cli_with_one_line(distdir):
    add, _, env = distdir
    add("first-dist", "first", SAME_NAME.format(name="dup"))
    add("second-dist", "second", SAME_NAME.format(name="dup"))
    done = run(env, "families")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == "error: family 'dup' is registered by both first-dist and second-dist"


BROKEN = '''
import numpy as np

from mosaic.plugins import hookimpl
from mosaic.records import Family


def make_inputs(shape, dtype, seed, values):
    rng = np.random.default_rng(0)  # ignores the seed; and unrounded float32 values are not bf16 numbers
    return {"x": rng.standard_normal((shape["n"],)).astype(np.float32)}


@hookimpl
def register_families(register):
    register(Family("broken", "a family that does not hold together", ("n",), lambda shape, e: (1.0, 2.0),
                    dtypes=("bf16",), distributions=("normal",), make_inputs=make_inputs))
'''


def test_families_check_passes_the_builtins_and_a_good_plugin_and_names_each_problem(distdir):
    add, _, env = distdir
    add("acme-families", "acme", DOUBLER)
    add("shoddy-dist", "shoddy", BROKEN)
    good = run(env, "families", "gemm", "attention", "rmsnorm", "softmax", "double", "--check")
    assert good.returncode == 0, good.stdout + good.stderr
    assert [line.split()[1] for line in good.stdout.splitlines()[2:7]] == ["ok"] * 5
    bad = run(env, "families", "broken", "nogen", "--check", "--json")
    assert bad.returncode == 1
    found = {f["name"]: f["check"] for f in json.loads(bad.stdout)["families"]}
    assert not found["broken"]["passed"] and not found["nogen"]["passed"]
    text = "\n".join(found["broken"]["problems"])
    assert "its oracle 'broken' is not registered" in text
    assert "bf16 normal: seeds 0 and 1 gave the same inputs" in text
    assert "bf16 normal: input 'x' holds values not representable in bf16" in text
    assert any("no input generator" in p for p in found["nogen"]["problems"])
    table = run(env, "families", "broken", "--check")
    assert table.returncode == 1 and "FAIL (3)" in table.stdout and "broken: its oracle" in table.stdout


def test_a_capture_child_reads_and_writes_the_oracle_cache_it_is_given(distdir, tmp_path, monkeypatch):
    """What a campaign's reference capture does (run/live/parent.py): its float64 reference lands in the
    campaign's cache, and the next capture of the same problem (the yardstick, every gate) reads it back."""
    from mosaic.capture import CaptureOptions, capture

    add, eps, env = distdir
    add("acme-families", "acme", DOUBLER)
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    spec = KernelSpec("double", {"rows": 6, "cols": 16}, "bf16", "doubler")
    opts = CaptureOptions(blocks=1, runs=1, timeout=120, values="halves")
    logs = []
    for name, cache in (("a", tmp_path / "oracle"), ("b", tmp_path / "oracle"), ("c", None)):
        capture(spec, "h200", tmp_path / f"{name}.bundle", opts, oracle_cache=cache)
        logs.append((tmp_path / f"{name}.bundle" / "capture.log").read_text())
        assert "Traceback" not in logs[-1], logs[-1]
    assert "oracle: pass" in logs[0] and "(float64 reference computed, no entry)" in logs[0]
    assert "(float64 reference cache-file)" in logs[1]
    assert "(float64 reference computed, no cache)" in logs[2]
    assert len(list((tmp_path / "oracle").iterdir())) == 1
