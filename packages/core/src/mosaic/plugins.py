"""The plugin host: discovers plugins through entry points, lazily and once, and owns the registries.

Loading is explicit (:func:`host` loads on first use, never at import time) and idempotent. Each
entry point in the group ``mosaic`` is imported, registered with pluggy and checked with
``check_pending()`` so a misspelt hookimpl is reported. A plugin that raises on load is reported and
skipped; it never takes the CLI down. ``MOSAIC_LOAD_PLUGINS=a,b`` loads only the named plugins
(``MOSAIC_LOAD_PLUGINS=`` loads none); an unknown name is an error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import attrs
import pluggy

from mosaic import hookspecs
from mosaic.errors import PluginError
from mosaic.records import Construct, Exploit, Family, GpuTarget, Language, Oracle, Proposer, Rewrite

GROUP = hookspecs.PROJECT
ALLOW_ENV = "MOSAIC_LOAD_PLUGINS"
hookimpl = pluggy.HookimplMarker(GROUP)

REGISTRIES: dict[str, tuple[str, type]] = {
    # registry kind: (hook name, record class)
    "languages": ("register_languages", Language),
    "gpus": ("register_gpus", GpuTarget),
    "constructs": ("register_constructs", Construct),
    "oracles": ("register_oracles", Oracle),
    "families": ("register_families", Family),
    "proposers": ("register_proposers", Proposer),
    "rewrites": ("register_rewrites", Rewrite),
    "exploits": ("register_exploits", Exploit),
}
SINGULAR = {"families": "family"}  # a registry kind's one-item name where dropping the "s" is wrong


def singular(kind: str) -> str:
    """``gpus`` -> ``gpu``, ``families`` -> ``family``."""
    return SINGULAR.get(kind, kind[:-1])


@attrs.define
class PluginInfo:
    """What the host knows about one entry point."""

    name: str
    distribution: str
    version: str
    module: Any = None
    hooks: list[str] = attrs.field(factory=list)
    error: str | None = None

    @property
    def loaded(self) -> bool:
        return self.error is None and self.module is not None

    def to_json(self) -> dict:
        return {"name": self.name, "distribution": self.distribution, "version": self.version,
                "hooks": sorted(self.hooks), "status": "ok" if self.loaded else "broken",
                "error": self.error}


@attrs.define
class Registered:
    item: Any
    plugin: str
    distribution: str


class PluginHost:
    """Holds the pluggy manager, the plugin table and one registry per kind."""

    def __init__(self, entry_points_: Iterable[EntryPoint] | None = None, allow: str | None = None):
        self._entry_points = entry_points_
        self._allow = allow
        self.pm = pluggy.PluginManager(GROUP)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.registries: dict[str, dict[str, Registered]] = {kind: {} for kind in REGISTRIES}
        self.artifact_readers: dict[str, Registered] = {}
        self.commands: dict[str, str] = {}  # top-level CLI command -> plugin that added it
        self._loaded = False

    # -- loading ---------------------------------------------------------------------------------
    def load(self) -> PluginHost:
        if self._loaded:
            return self
        self._loaded = True
        eps = list(self._entry_points if self._entry_points is not None else entry_points(group=GROUP))
        allow = self._allow if self._allow is not None else os.environ.get(ALLOW_ENV)
        if allow is not None:
            wanted = [n.strip() for n in allow.split(",") if n.strip()]
            known = {ep.name for ep in eps}
            unknown = [n for n in wanted if n not in known]
            if unknown:
                raise PluginError(
                    f"{ALLOW_ENV} names unknown plugin(s) {', '.join(unknown)}; installed: "
                    f"{', '.join(sorted(known)) or 'none'}", ALLOW_ENV)
            eps = [ep for ep in eps if ep.name in wanted]
        for ep in sorted(eps, key=lambda e: e.name):
            self._load_one(ep)
        for kind in REGISTRIES:
            self._collect(kind)
        self._collect_readers()
        return self

    def _load_one(self, ep: EntryPoint) -> None:
        dist = ep.dist.name if ep.dist is not None else "?"
        ver = ep.dist.version if ep.dist is not None else "?"
        if ep.name in self.plugins:
            other = self.plugins[ep.name].distribution
            raise PluginError(f"plugin name '{ep.name}' is provided by both {other} and {dist}")
        info = PluginInfo(name=ep.name, distribution=dist, version=ver)
        self.plugins[ep.name] = info
        try:
            module = ep.load()
            self.pm.register(module, name=ep.name)
        except Exception as exc:  # a broken third-party plugin is reported and skipped
            info.error = f"failed to load: {type(exc).__name__}: {exc}"
            _warn(f"plugin '{ep.name}' ({dist}) {info.error}; skipped")
            return
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            self.pm.unregister(name=ep.name)
            info.error = f"invalid hook implementation: {exc}"
            _warn(f"plugin '{ep.name}' ({dist}) has an {info.error}; skipped")
            return
        info.module = module
        info.hooks = sorted(h.name for h in self.pm.get_hookcallers(module) or [])

    def _impls(self, hook_name: str):
        return getattr(self.pm.hook, hook_name).get_hookimpls()

    def _collect(self, kind: str) -> None:
        hook_name, record_cls = REGISTRIES[kind]
        registry = self.registries[kind]
        for impl in self._impls(hook_name):
            info = self.plugins[impl.plugin_name]

            def register(item: Any, _info: PluginInfo = info) -> None:
                if not isinstance(item, record_cls):
                    raise PluginError(f"plugin '{_info.name}' ({_info.distribution}) registered a "
                                      f"{type(item).__name__} where {hook_name} takes a {record_cls.__name__}")
                name = item.name
                if name in registry:
                    first = registry[name]
                    raise PluginError(f"{singular(kind)} '{name}' is registered by both {first.distribution} "
                                      f"and {_info.distribution}")
                registry[name] = Registered(item, _info.name, _info.distribution)

            try:
                impl.function(register=register)
            except PluginError:
                raise
            except Exception as exc:
                info.error = f"{hook_name} raised {type(exc).__name__}: {exc}"
                _warn(f"plugin '{info.name}' ({info.distribution}) {info.error}; its {kind} are skipped")
                for key in [k for k, r in registry.items() if r.plugin == info.name]:
                    del registry[key]

    def _collect_readers(self) -> None:
        for impl in self._impls("register_artifact_readers"):
            info = self.plugins[impl.plugin_name]

            def register(suffix: str, to_text: Callable[[bytes], str], _info: PluginInfo = info) -> None:
                if suffix in self.artifact_readers:
                    raise PluginError(f"artifact reader for '{suffix}' is registered by both "
                                      f"{self.artifact_readers[suffix].distribution} and {_info.distribution}")
                self.artifact_readers[suffix] = Registered(to_text, _info.name, _info.distribution)

            impl.function(register=register)

    # -- queries ---------------------------------------------------------------------------------
    def items(self, kind: str) -> dict[str, Any]:
        return {name: reg.item for name, reg in sorted(self.registries[kind].items())}

    def get(self, kind: str, name: str) -> Any:
        registry = self.registries[kind]
        if name not in registry:
            known = ", ".join(sorted(registry)) or "none installed"
            raise PluginError(f"unknown {singular(kind)} '{name}'; known: {known}")
        return registry[name].item

    def add_commands(self, cli: Any) -> None:
        """Let plugins add CLI commands; a clash with an existing command names both owners."""
        for impl in self._impls("register_commands"):
            info = self.plugins[impl.plugin_name]
            before = dict(cli.commands)
            try:
                impl.function(cli=cli)
            except Exception as exc:
                info.error = f"register_commands raised {type(exc).__name__}: {exc}"
                _warn(f"plugin '{info.name}' ({info.distribution}) {info.error}; its commands are skipped")
                cli.commands = before
                continue
            for name, cmd in cli.commands.items():
                if name in before and before[name] is not cmd:
                    owner = getattr(before[name], "mosaic_distribution", "mosaic-core")
                    raise PluginError(f"command '{name}' is registered by both {owner} and {info.distribution}")
                if name not in before:
                    cmd.mosaic_distribution = info.distribution
                    self.commands[name] = info.name


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


_HOST: PluginHost | None = None


def host() -> PluginHost:
    """The process-wide plugin host, loaded on first use."""
    global _HOST
    if _HOST is None:
        _HOST = PluginHost()
    return _HOST.load()


def reset() -> None:
    """Forget the loaded plugins (tests; a changed environment)."""
    global _HOST
    _HOST = None
