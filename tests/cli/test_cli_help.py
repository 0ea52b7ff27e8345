"""The ``rankscope`` command as a first-time user meets it: --version, usage errors, and
help texts that explain every option in plain words."""
from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from rankscope.cli import SUBCOMMANDS, main

# Sphinx markup a terminal would show verbatim.
MARKUP = re.compile(r"``|:(class|func|mod|data|meth):")


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rankscope", *argv], capture_output=True, text=True, timeout=120)


def test_version_and_bare_command_through_the_real_cli():
    import rankscope
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"rankscope {rankscope.__version__}", out
    bare = run_cli()
    assert bare.returncode == 2 and "usage: rankscope <command>" in bare.stderr and not bare.stdout
    unknown = run_cli("lanch")
    assert unknown.returncode == 2 and "unknown command 'lanch'" in unknown.stderr


def _parsers_of(verb: str, monkeypatch, capsys) -> list[argparse.ArgumentParser]:
    """Every parser the verb builds, with its sub-commands' parsers."""
    seen: list[argparse.ArgumentParser] = []
    orig = argparse.ArgumentParser.parse_known_args

    def spy(self, *a, **k):
        seen.append(self)
        return orig(self, *a, **k)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", spy)
    with pytest.raises(SystemExit) as exit_:
        main([verb, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert not MARKUP.search(text), f"rankscope {verb} --help shows markup:\n{text}"
    out = list(seen)
    for parser in seen:
        for action in parser._actions:  # noqa: SLF001 - argparse keeps them only here
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                out += list(action.choices.values())
    return out


@pytest.mark.parametrize("verb", sorted(SUBCOMMANDS))
def test_every_option_of_every_verb_has_plain_help(verb, monkeypatch, capsys):
    parsers = _parsers_of(verb, monkeypatch, capsys)
    assert parsers, f"rankscope {verb} built no parser"
    missing = [f"{p.prog} {a.option_strings or a.dest}" for p in parsers for a in p._actions  # noqa: SLF001
               if not a.help or a.help == argparse.SUPPRESS and a.dest != "help"]
    assert not missing, missing
    for p in parsers:
        assert not MARKUP.search(p.format_help()), p.format_help()
