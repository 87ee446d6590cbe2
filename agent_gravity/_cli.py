"""Command line: ``agent-gravity demo``, ``agent-gravity model pull``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys


def _quiet_engine_logs() -> None:
    # vLLM logs to stdout by default; keep stdout for our table or JSON.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


def _demo(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from agent_gravity import ChatGravity, _model_store
    from agent_gravity._demo import QUESTIONS, as_json, as_table, run_demo

    bar = tqdm(total=2 + 2 * len(QUESTIONS), desc="fetching the model", file=sys.stderr, unit="step")
    with contextlib.redirect_stdout(sys.stderr):
        if args.model is None:
            _model_store.pull(progress=lambda msg: bar.set_description(msg))
        bar.update(1)
        bar.set_description("starting the vLLM engine")
        llm = ChatGravity(model=args.model)
        llm.get_backend()
        bar.update(1)

        def advance(run) -> None:
            bar.set_description(f"answered ({run.mode})")
            bar.update(1)

        runs = run_demo(llm, on_run=advance)
    bar.close()
    if args.json:
        print(json.dumps(as_json(llm, runs)))
    else:
        print(as_table(runs))
    return 0


def _model_pull(args: argparse.Namespace) -> int:
    from agent_gravity import _model_store

    print(_model_store.pull(progress=lambda msg: print(msg, file=sys.stderr)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent-gravity", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="answer a few reasoning questions with gravity off and on")
    demo.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    demo.add_argument("--model", help="a local model folder (default: the embedded SmolLM2-135M-Instruct)")
    demo.set_defaults(run=_demo)
    model = commands.add_parser("model", help="manage the embedded model")
    model_commands = model.add_subparsers(dest="model_command", required=True)
    pull = model_commands.add_parser("pull", help="fetch, verify and convert the embedded model; print its folder")
    pull.set_defaults(run=_model_pull)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_engine_logs()
    try:
        return args.run(args)
    except Exception as exc:  # noqa: BLE001 - a CLI user gets the message, not a traceback
        from agent_gravity import GravityError

        if not isinstance(exc, GravityError | ValueError):
            raise
        print(f"agent-gravity: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
