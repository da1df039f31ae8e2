"""The CLI's shape: one module per verb under mosaic.commands, cli.py only the root group, a light start-up."""

import subprocess
import sys

import click
from mosaic.cli import cli
from mosaic.commands import VERBS

CORE_VERBS = {"plugins", "gpus", "families", "bundle", "catalog", "lift", "diff", "check", "capture", "run", "doctor", "mcp", "cache",
              "trust", "fuzz"}


def test_every_core_verb_lives_in_its_own_commands_module_and_is_registered():
    names = {v.name for v in VERBS}
    assert names == CORE_VERBS and len(VERBS) == len(CORE_VERBS)
    for verb in VERBS:
        assert isinstance(verb, click.Command)
        assert verb.callback.__module__ == f"mosaic.commands.{verb.name}"
        assert cli.commands[verb.name] is verb


def test_starting_the_cli_imports_no_verb_body():
    code = ("import sys, mosaic.cli; "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'networkx', 'pluggy', 'torch', "
            "'jax') or m.startswith(('mosaic.run', 'mosaic.families', 'mosaic.lift', 'mosaic.capture', "
            "'mosaic.plugins', 'mosaic.bundle', 'mosaic.oracle'))); print(heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
