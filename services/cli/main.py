"""The `dqoes` command: one entry point, one sub-command per job.

Every sub-command has --help, and those that report results take --json
(one JSON object, the last line of stdout). Bad input is one line on stderr
and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from experiments.common import ExperimentError, sigterm_as_interrupt
from services.cli import calibrate, experiment, join, live, operate, serve
from services.cli import dashboard as dashboard_cli
from services.cli.common import CliError, parse_with_pairs
from shared import auth
from shared.scenarios.spec import ScenarioError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dqoes",
        description="DQoES: per-container quality-of-experience targets for deep-learning services.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    experiment.add_parser(sub)
    live.add_parsers(sub)
    serve.add_parsers(sub)
    join.add_parsers(sub)
    operate.add_parsers(sub)
    dashboard_cli.add_parsers(sub)
    calibrate.add_parsers(sub)
    auth.add_arguments(sub)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, NAME=VALUE pairs after an option included (`common.parse_with_pairs`)."""
    return parse_with_pairs(build_parser(), argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # SIGTERM cleans up as Ctrl-C does: the experiments stop what they started on KeyboardInterrupt.
    # Commands that follow signals themselves (up, dashboard, record) set their own while they run.
    try:
        with sigterm_as_interrupt():
            if args.command == "auth":
                return auth.run_command(args)
            return int(args.func(args) or 0)
    except (ScenarioError, CliError, ExperimentError, auth.AuthError) as e:
        print(f"dqoes: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dqoes: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
