"""The plugin host against real (temporary) distributions on a private sys.path entry."""

import importlib.metadata as md
import sys
import textwrap

import click
import pytest
from mosaic.errors import PluginError
from mosaic.plugins import PluginHost

GPU_RECORD = """
from mosaic.records import GpuTarget
def gpu(name):
    return GpuTarget(name=name, display_name=name, arch="sm_90a", compute_capability=(9, 0), sm_count=1,
        smem_per_sm=10, smem_per_block=10, regs_per_sm=10, l2_bytes=10, hbm_bandwidth_gbs=1.0,
        memory_bytes=10, peak_bf16_tflops=1.0, peak_fp8_tflops=1.0, max_cluster_size=1, device_names=(name,))
"""


@pytest.fixture
def distdir(tmp_path, monkeypatch):
    """Write distributions into tmp_path; return (add, entry_points) helpers."""
    monkeypatch.syspath_prepend(str(tmp_path))
    created = []

    def add(dist: str, ep_name: str, source: str, module: str | None = None):
        module = module or f"plug_{dist.replace('-', '_')}"
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        info = tmp_path / f"{dist.replace('-', '_')}-1.2.3.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\n")
        (info / "entry_points.txt").write_text(f"[mosaic]\n{ep_name} = {module}\n")
        created.append(module)

    def eps():
        return [ep for d in md.distributions(path=[str(tmp_path)]) for ep in d.entry_points if ep.group == "mosaic"]

    yield add, eps
    for m in created:
        sys.modules.pop(m, None)


def test_registers_and_attributes_to_distribution(distdir):
    add, eps = distdir
    add("acme-gpus", "acme", "from mosaic.plugins import hookimpl\n" + GPU_RECORD +
        "@hookimpl\ndef register_gpus(register):\n    register(gpu('acme1'))\n")
    h = PluginHost(eps()).load()
    assert h.plugins["acme"].distribution == "acme-gpus" and h.plugins["acme"].version == "1.2.3"
    assert h.plugins["acme"].hooks == ["register_gpus"]
    assert list(h.items("gpus")) == ["acme1"]
    assert h.registries["gpus"]["acme1"].distribution == "acme-gpus"
    with pytest.raises(PluginError, match="unknown gpu 'nope'; known: acme1"):
        h.get("gpus", "nope")


def test_duplicate_name_names_both_distributions(distdir):
    add, eps = distdir
    body = "from mosaic.plugins import hookimpl\n" + GPU_RECORD + \
        "@hookimpl\ndef register_gpus(register):\n    register(gpu('same'))\n"
    add("first-dist", "first", body)
    add("second-dist", "second", body)
    with pytest.raises(PluginError, match="gpu 'same' is registered by both first-dist and second-dist"):
        PluginHost(eps()).load()


def test_broken_plugin_is_reported_and_skipped(distdir, capsys):
    add, eps = distdir
    add("good-dist", "good", "from mosaic.plugins import hookimpl\n" + GPU_RECORD +
        "@hookimpl\ndef register_gpus(register):\n    register(gpu('ok'))\n")
    add("bad-dist", "bad", "raise RuntimeError('boom at import')\n")
    h = PluginHost(eps()).load()
    assert h.plugins["bad"].error == "failed to load: RuntimeError: boom at import"
    assert not h.plugins["bad"].loaded and h.plugins["good"].loaded
    assert list(h.items("gpus")) == ["ok"]
    assert "plugin 'bad' (bad-dist) failed to load" in capsys.readouterr().err


def test_misspelt_hookimpl_is_caught_by_check_pending(distdir, capsys):
    add, eps = distdir
    add("typo-dist", "typo", "from mosaic.plugins import hookimpl\n"
        "@hookimpl\ndef register_gpu(register):\n    pass\n")
    h = PluginHost(eps()).load()
    assert "invalid hook implementation" in h.plugins["typo"].error
    assert "register_gpu" in h.plugins["typo"].error
    assert "typo-dist" in capsys.readouterr().err


def test_registering_wrong_record_type_is_an_error(distdir):
    add, eps = distdir
    add("wrong-dist", "wrong", "from mosaic.plugins import hookimpl\n"
        "@hookimpl\ndef register_gpus(register):\n    register('h200')\n")
    with pytest.raises(PluginError, match="registered a str where register_gpus takes a GpuTarget"):
        PluginHost(eps()).load()


def test_raising_register_hook_drops_only_that_plugin(distdir):
    add, eps = distdir
    add("half-dist", "half", "from mosaic.plugins import hookimpl\n" + GPU_RECORD +
        "@hookimpl\ndef register_gpus(register):\n    register(gpu('partial'))\n    raise ValueError('oops')\n")
    h = PluginHost(eps()).load()
    assert h.items("gpus") == {}
    assert "register_gpus raised ValueError: oops" in h.plugins["half"].error


def test_allow_list(distdir):
    add, eps = distdir
    for n in ("one", "two"):
        add(f"{n}-dist", n, "from mosaic.plugins import hookimpl\n" + GPU_RECORD +
            f"@hookimpl\ndef register_gpus(register):\n    register(gpu('{n}'))\n")
    assert list(PluginHost(eps(), allow="two").load().plugins) == ["two"]
    assert list(PluginHost(eps(), allow="").load().plugins) == []
    with pytest.raises(PluginError, match="unknown plugin.*three; installed: one, two"):
        PluginHost(eps(), allow="two,three").load()


def test_load_is_lazy_and_idempotent(distdir):
    add, eps = distdir
    add("count-dist", "count", "from mosaic.plugins import hookimpl\n" + GPU_RECORD +
        "CALLS = []\n@hookimpl\ndef register_gpus(register):\n    CALLS.append(1)\n    register(gpu('c'))\n")
    h = PluginHost(eps())
    assert h.plugins == {}  # nothing happens until load()
    h.load()
    h.load()
    assert sys.modules["plug_count_dist"].CALLS == [1]


def test_command_clash_names_both(distdir):
    add, eps = distdir
    add("cmd-dist", "cmd", "import click\nfrom mosaic.plugins import hookimpl\n"
        "@hookimpl\ndef register_commands(cli):\n    cli.add_command(click.Command('plugins', help='x'))\n")
    root = click.Group("m")
    root.add_command(click.Command("plugins", help="core"))
    with pytest.raises(PluginError, match="command 'plugins' is registered by both mosaic-core and cmd-dist"):
        PluginHost(eps()).load().add_commands(root)
