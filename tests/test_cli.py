"""The command line dispatches to one module per subcommand, each registered through ``register(subparsers)``."""

import argparse

import pytest

from fmaudit import cli
from fmaudit.commands import floats, ints, words


def test_every_command_module_is_registered(capsys):
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {"init", "list", "probe", "grid", "download", "check-config", "check-claims", "embed",
                                "profile", "cells", "gate", "adapt", "docs", "cost"}
    for name in cli.COMMANDS:  # every module registers a parser whose handler lives in that module
        command = cli.command_module(name)
        handlers = {p.get_default("func") for p in sub.choices.values()}
        handlers |= {q.get_default("func") for p in sub.choices.values() for a in p._actions
                     if isinstance(a, argparse._SubParsersAction) for q in a.choices.values()}
        assert any(getattr(h, "__module__", None) == command.__name__ for h in handlers), command.__name__
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "check-config" in capsys.readouterr().out


def test_a_new_command_needs_only_a_register_function(monkeypatch, capsys):
    class Hello:
        @staticmethod
        def run(args):
            print(f"hello {args.name}")
            return 3

        @classmethod
        def register(cls, subparsers):
            p = subparsers.add_parser("hello")
            p.add_argument("name")
            p.set_defaults(func=cls.run)

    monkeypatch.setattr(cli, "COMMANDS", {**cli.COMMANDS, "hello": (Hello, "say hello")})
    assert cli.main(["hello", "world"]) == 3
    assert capsys.readouterr().out == "hello world\n"


def test_input_errors_exit_2_with_the_message(capsys):
    assert cli.main(["check-config", "--configfile", "no/such/config.yaml"]) == 2
    assert "no/such/config.yaml" in capsys.readouterr().err


def test_list_options_accept_commas_and_spaces():
    assert floats("0.01,0.1 1") == [0.01, 0.1, 1.0]
    assert ints("0, 1,2") == [0, 1, 2]
    assert words("logistic,knn") == ["logistic", "knn"]


def test_a_command_imports_only_its_own_module():
    # fmaudit grid must start fast: the other commands' modules (adapt imports torch) stay unimported
    import subprocess
    import sys

    probe = ("import sys, contextlib, io\nfrom fmaudit import cli\n"
             "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
             "    cli.main(['grid', '--help'])\n"
             "print(sorted(m for m in ('torch', 'fmaudit.commands.adapt', 'fmaudit.commands.probe') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_help_listed_without_importing_a_command_is_its_own():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    listed = {action.dest: action.help for action in sub._choices_actions}
    assert listed == {name: help_text for name, (_, help_text) in cli.COMMANDS.items()}
