"""The command line dispatches to one module per subcommand, each registered through ``register(subparsers)``."""

import argparse

import pytest

from fmaudit import cli
from fmaudit.commands import floats, ints, words


def test_every_command_module_is_registered(capsys):
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {"init", "list", "probe", "grid", "download", "check-config", "check-claims", "embed",
                                "profile", "cells", "gate", "adapt", "cost"}
    for command in cli.COMMANDS:  # every module registers a parser whose handler lives in that module
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

    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, Hello))
    assert cli.main(["hello", "world"]) == 3
    assert capsys.readouterr().out == "hello world\n"


def test_input_errors_exit_2_with_the_message(capsys):
    assert cli.main(["check-config", "--configfile", "no/such/config.yaml"]) == 2
    assert "no/such/config.yaml" in capsys.readouterr().err


def test_list_options_accept_commas_and_spaces():
    assert floats("0.01,0.1 1") == [0.01, 0.1, 1.0]
    assert ints("0, 1,2") == [0, 1, 2]
    assert words("logistic,knn") == ["logistic", "knn"]
