"""Hook specifications: everything a plugin adds reaches core through one of these.

Specs only, no implementations. A plugin module marks its functions with ``@hookimpl`` (from
``mosaic.plugins``) and is advertised under the entry-point group ``mosaic``; the entry-point name is
the short name users type. Registries take a ``register`` callback that the host owns, so the host
validates and de-duplicates what plugins add.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import click

    from mosaic.records import Construct, Exploit, Family, GpuTarget, Language, Oracle, Proposer, Rewrite

PROJECT = "mosaic"
hookspec = pluggy.HookspecMarker(PROJECT)


@hookspec
def register_languages(register: Callable[[Language], None]) -> None:
    """Register the kernel languages this plugin provides.

    :param register: call once per :class:`~mosaic.records.Language`. A name another plugin already
        registered is a conflict and stops the command with an error naming both distributions.
    """


@hookspec
def register_gpus(register: Callable[[GpuTarget], None]) -> None:
    """Register :class:`~mosaic.records.GpuTarget` records (one per GPU model).

    :param register: call once per record; ``name`` is the short name users pass to ``--gpu``.
    """


@hookspec
def register_constructs(register: Callable[[Construct], None]) -> None:
    """Contribute construct-catalog entries: how a concept (TMA load, pipeline stage, ...) is written in
    a language, and whether it has a direct analogue.

    :param register: call once per :class:`~mosaic.records.Construct`; keyed by ``concept@language``.
    """


@hookspec
def register_oracles(register: Callable[[Oracle], None]) -> None:
    """Register float64 reference models, one per kernel family (``gemm``, ``rmsnorm``, ...).

    :param register: call once per :class:`~mosaic.records.Oracle`; keyed by family.
    """


@hookspec
def register_families(register: Callable[[Family], None]) -> None:
    """Register kernel families (``gemm``, ``attention``, ...): dimensions and shape parser, input
    generators, the name of the float64 oracle, FLOP and byte counts (the physical floor) and yardsticks.

    :param register: call once per :class:`~mosaic.records.Family`; ``name`` is what users pass to
        ``--family``. A name registered twice (by two plugins, or by a plugin and mosaic-core, whose
        built-ins go through this same hook) is a conflict and stops the command with one error line
        naming both distributions.
    """


@hookspec
def register_proposers(register: Callable[[Proposer], None]) -> None:
    """Register edit proposers for the convergence loop (``knobs``, ``command``, ...).

    :param register: call once per :class:`~mosaic.records.Proposer`.
    """


@hookspec
def register_rewrites(register: Callable[[Rewrite], None]) -> None:
    """Contribute mechanical source rewrites of catalog concepts (exact <-> approximate ``exp``, an unroll
    bound, ...) for a language's kernel files; the ``rewrites`` proposer applies them without an agent.

    :param register: call once per :class:`~mosaic.records.Rewrite`; keyed by ``rewrite@language``.
    """


@hookspec
def register_exploits(register: Callable[[Exploit], None]) -> None:
    """Contribute adversarial kernel files for ``mosaic trust`` (and honest controls the gate must pass).

    :param register: call once per :class:`~mosaic.records.Exploit`; keyed by ``exploit@language``.
    """


@hookspec
def register_commands(cli: click.Group) -> None:
    """Add sub-commands or groups to the ``mosaic`` command line.

    :param cli: the root click group. Use ``cli.add_command(group)``; a command name that exists
        already is a conflict and stops the command with an error naming both distributions.
    """


@hookspec
def register_artifact_readers(register: Callable[[str, Callable[[bytes], str]], None]) -> None:
    """Teach lifting to read another machine-code container.

    :param register: ``register(suffix, to_text)`` where ``suffix`` is a file suffix (``".hsaco"``) and
        ``to_text`` turns the file's bytes into assembly text that a registered lifter parses.
        (Core reads ``.cubin``, SASS text and PTX itself.)
    """
