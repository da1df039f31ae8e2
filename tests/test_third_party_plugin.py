"""A third-party backend plugin, built in a temp dir as its own distribution and pip-installed into the
test environment: `mosaic plugins` lists it, and the conformance kit passes for it."""

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

PYPROJECT = """
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "acme-mosaic-toy"
version = "0.3.0"
dependencies = ["mosaic-core"]

[project.entry-points.mosaic]
toy = "acme_mosaic_toy.plugin"
"""

PLUGIN = '''
from mosaic.plugins import hookimpl
from mosaic.records import GpuTarget, Language

TOY_GPU = GpuTarget(name="toy-gpu", display_name="Acme Toy Accelerator", arch="sm_90a",
                    compute_capability=(9, 0), sm_count=7, smem_per_sm=65536, smem_per_block=49152,
                    regs_per_sm=65536, l2_bytes=4 << 20, hbm_bandwidth_gbs=500.0, memory_bytes=8 << 30,
                    peak_bf16_tflops=50.0, peak_fp8_tflops=100.0, max_cluster_size=1,
                    device_names=("Acme Toy",))


@hookimpl
def register_languages(register):
    register(Language(name="toy", summary="A toy kernel language for the plugin tests.", families=("gemm",)))


@hookimpl
def register_gpus(register):
    register(TOY_GPU)
'''

CONFORMANCE = '''
from mosaic.testing import GpuPluginTests, LanguagePluginTests


class TestToyLanguage(LanguagePluginTests):
    plugin = "toy"
    languages = {"toy"}


class TestToyGpu(GpuPluginTests):
    plugin = "toy"
    gpus = {"toy-gpu"}
'''


@pytest.fixture(scope="module")
def toy_installed(tmp_path_factory):
    src = tmp_path_factory.mktemp("acme")
    (src / "pyproject.toml").write_text(PYPROJECT)
    pkg = src / "src" / "acme_mosaic_toy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "plugin.py").write_text(textwrap.dedent(PLUGIN))
    (src / "tests").mkdir()
    (src / "tests" / "test_conformance.py").write_text(textwrap.dedent(CONFORMANCE))
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "--no-deps", "--no-build-isolation", str(src)], check=True, timeout=300)
    yield src
    subprocess.run([*pip, "uninstall", "-y", "acme-mosaic-toy"], check=True, timeout=300)


def test_listed_by_mosaic_plugins(toy_installed, mosaic):
    data = json.loads(mosaic("plugins", "--json", check=0).stdout)
    toy = next(p for p in data["plugins"] if p["name"] == "toy")
    assert toy["distribution"] == "acme-mosaic-toy" and toy["version"] == "0.3.0"
    assert toy["hooks"] == ["register_gpus", "register_languages"]
    assert set(toy["provides"]) == {"language:toy", "gpu:toy-gpu"}
    assert "toy-gpu" in mosaic("gpus", check=0).stdout


def test_conformance_kit_passes_for_it(toy_installed):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(toy_installed / "tests")], capture_output=True, text=True, timeout=300,
                          cwd=toy_installed)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "10 passed" in proc.stdout, proc.stdout[-2000:]


def test_kit_catches_a_broken_promise(toy_installed, tmp_path):
    (tmp_path / "test_wrong.py").write_text(textwrap.dedent('''
        from mosaic.testing import GpuPluginTests

        class TestToyWrong(GpuPluginTests):
            plugin = "toy"
            gpus = {"toy-gpu", "toy-gpu-2"}
    '''))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1 and "promised" in proc.stdout
