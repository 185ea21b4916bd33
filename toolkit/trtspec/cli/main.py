"""``trtspec`` entry point: the root group and the registration of each
command module. Each command group lives in its own thin module."""

from __future__ import annotations

import click

from trtspec import __version__
from trtspec.cli._errors import BoundaryGroup


@click.group(cls=BoundaryGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trtspec")
def cli() -> None:
    """Build TensorRT-LLM speculative-decoding engines from a YAML spec, serve
    them under Triton, and benchmark each variant against the baseline per route."""


def _register() -> None:
    from trtspec.cli import bench as bench_cmd
    from trtspec.cli import build as build_cmd
    from trtspec.cli import compare as compare_cmd
    from trtspec.cli import deploy as deploy_cmd
    from trtspec.cli import doctor as doctor_cmd
    from trtspec.cli import repo as repo_cmd
    from trtspec.cli import rollout as rollout_cmd
    from trtspec.cli import routes as routes_cmd
    from trtspec.cli import serve as serve_cmd
    from trtspec.cli import serve_llmapi as serve_llmapi_cmd

    for module in (
        build_cmd,
        repo_cmd,
        serve_cmd,
        serve_llmapi_cmd,
        bench_cmd,
        compare_cmd,
        doctor_cmd,
        deploy_cmd,
        routes_cmd,
        rollout_cmd,
    ):
        for command in module.COMMANDS:
            cli.add_command(command)


_register()


def main() -> None:
    cli(prog_name="trtspec")


if __name__ == "__main__":
    main()
