"""The conformance kit: base test classes that every plugin subclasses in a few lines.

A plugin's test module says which entry point it is and what it promises::

    from mosaic.testing import GpuPluginTests

    class TestHopperPlugin(GpuPluginTests):
        plugin = "hopper"
        gpus = {"h100-sxm", "h100-pcie", "h200"}

pytest collects the subclass (its name starts with ``Test``) and runs every check below against the
installed distribution, exactly as a user's ``mosaic`` would see it. Base classes do not start with
``Test`` so pytest never collects them on their own.
"""

from __future__ import annotations

from typing import ClassVar

import pytest

from mosaic.plugins import REGISTRIES, PluginHost
from mosaic.records import GpuTarget, Language


class PluginTests:
    """Checks that hold for every plugin: it is installed under group ``mosaic``, loads alone, its
    hookimpls match the specs, and it registers exactly what it promises."""

    plugin: ClassVar[str] = ""
    #: kind -> names the plugin promises to register (subclasses fill in what applies)
    promises: ClassVar[dict[str, set[str]]] = {}

    def _promises(self) -> dict[str, set[str]]:
        return {k: set(v) for k, v in self.promises.items()}

    @pytest.fixture(scope="class")
    def loaded(self) -> PluginHost:
        assert self.plugin, f"{type(self).__name__}.plugin must name the entry point"
        return PluginHost(allow=self.plugin).load()

    def test_entry_point_loads(self, loaded: PluginHost) -> None:
        info = loaded.plugins[self.plugin]
        assert info.error is None, info.error
        assert info.loaded
        assert info.distribution not in ("", "?")
        assert info.hooks, "a plugin must implement at least one hook"

    def test_registers_what_it_promises(self, loaded: PluginHost) -> None:
        for kind, names in self._promises().items():
            assert kind in REGISTRIES, f"unknown registry kind {kind!r}"
            got = {n for n, r in loaded.registries[kind].items() if r.plugin == self.plugin}
            assert got == names, f"{kind}: registered {sorted(got)}, promised {sorted(names)}"

    def test_records_roundtrip(self, loaded: PluginHost) -> None:
        for kind in ("gpus",):
            for reg in loaded.registries[kind].values():
                assert type(reg.item).from_json(reg.item.to_json()) == reg.item

    def test_loading_twice_is_idempotent(self, loaded: PluginHost) -> None:
        again = loaded.load()
        assert again is loaded
        assert list(again.plugins) == [self.plugin]


class GpuPluginTests(PluginTests):
    """For plugins that register GPU records: set ``gpus`` to the names promised."""

    gpus: ClassVar[set[str]] = set()

    def _promises(self) -> dict[str, set[str]]:
        return {**super()._promises(), "gpus": set(self.gpus)}

    def test_gpu_records_are_plausible(self, loaded: PluginHost) -> None:
        assert self.gpus, "list the GPU names this plugin registers"
        for name in self.gpus:
            t: GpuTarget = loaded.get("gpus", name)
            major, minor = t.compute_capability
            assert t.arch.startswith(f"sm_{major}{minor}"), (t.arch, t.compute_capability)
            assert t.smem_per_block <= t.smem_per_sm
            assert t.max_threads_per_block <= t.max_threads_per_sm
            assert t.peak_fp8_tflops >= t.peak_bf16_tflops
            assert t.device_names, f"{name}: device_names is needed to detect the device"
            assert t.matches(t.device_names[0], t.compute_capability, t.sm_count)
            assert not t.matches(t.device_names[0], t.compute_capability, t.sm_count + 1)


class LanguagePluginTests(PluginTests):
    """For plugins that register kernel languages: set ``languages`` to the names promised."""

    languages: ClassVar[set[str]] = set()

    def _promises(self) -> dict[str, set[str]]:
        return {**super()._promises(), "languages": set(self.languages)}

    def test_languages_describe_themselves(self, loaded: PluginHost) -> None:
        assert self.languages, "list the language names this plugin registers"
        for name in self.languages:
            lang: Language = loaded.get("languages", name)
            assert lang.summary.strip(), f"{name}: empty summary"
            assert all(isinstance(f, str) and f for f in lang.families)


class CommandPluginTests(PluginTests):
    """For plugins that add CLI commands: set ``commands`` to the top-level names they add."""

    commands: ClassVar[set[str]] = set()

    def test_commands_are_added(self, loaded: PluginHost) -> None:
        import click

        root = click.Group("mosaic-conformance")
        loaded.add_commands(root)
        assert set(root.commands) == set(self.commands)
        for name in self.commands:
            assert root.commands[name].help, f"command {name!r} needs help text"
