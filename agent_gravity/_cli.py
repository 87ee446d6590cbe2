"""Command line: ``agent-gravity demo``, ``model pull``, ``calibrate``, ``bench ...``, ``report``, ``dashboard`` and
``serve``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO


def _positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def _budget_arguments(parser: argparse.ArgumentParser) -> None:
    """``--max-reasoning-tokens`` and ``--max-answer-tokens``: the budgets every run of a measurement gets."""
    parser.add_argument("--max-reasoning-tokens", type=_positive, default=None,
                        help="every run's reasoning budget, the full run's included (default: GravityConfig's); "
                             "where references are run, the items it caps get 4x for theirs")
    parser.add_argument("--max-answer-tokens", type=_positive, default=None,
                        help="every run's answer budget (default: GravityConfig's)")


def _budgets(args: argparse.Namespace) -> Any:
    """The budgets asked for, checked before any engine starts (ValueError naming the setting it refuses)."""
    from agent_gravity._config import GravityConfig
    from agent_gravity.bench.savings import Budgets

    asked = {"reasoning": args.max_reasoning_tokens, "answer": args.max_answer_tokens}
    budgets = Budgets(**{k: v for k, v in asked.items() if v is not None})
    budgets.apply(GravityConfig())
    return budgets


def _quiet_engine_logs() -> None:
    # vLLM logs to stdout by default; keep stdout for our table or JSON.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


@contextlib.contextmanager
def _engine_output(log: Path | None) -> Iterator[TextIO]:
    """Send everything this process and its children write to stdout and stderr (the engine's, torch's and Triton's
    warnings, from Python or C) to ``log``; yield a stream to the terminal's stderr for progress. None: no change."""
    if log is None:
        with contextlib.redirect_stdout(sys.stderr):
            yield sys.stderr
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    terminal = os.fdopen(os.dup(saved[2]), "w", buffering=1)
    try:
        with log.open("ab") as out:
            for fd in saved:
                os.dup2(out.fileno(), fd)
            yield terminal
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, original in saved.items():
            os.dup2(original, fd)
            os.close(original)
        terminal.close()


def _demo(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from agent_gravity import ChatGravity, _model_store
    from agent_gravity._demo import QUESTIONS, as_json, as_table, run_demo

    log = None if args.verbose else _model_store.cache_dir() / "logs" / "demo.log"
    if log is not None:
        print(f"engine log: {log} (-v shows it here)", file=sys.stderr)
    with _engine_output(log) as terminal:
        bar = tqdm(total=2 + 2 * len(QUESTIONS), desc="fetching the model", file=terminal, unit="step")
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


def _bench_overhead(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from agent_gravity import ChatGravity
    from agent_gravity.bench import overhead

    bar = tqdm(total=len(args.batch) * 2 * args.rounds, desc="starting the vLLM engine", file=sys.stderr)
    with contextlib.redirect_stdout(sys.stderr):
        backend = ChatGravity(model=args.model).get_backend()

        def advance(r) -> None:
            bar.set_description(f"batch {r.batch} {r.mode}: {r.tokens_per_s:.1f} tok/s")
            bar.update(1)

        report = overhead.main(backend, args.batch, args.rounds, args.tokens, Path(args.out), advance)
    bar.close()
    print(overhead.table(report))
    print(f"wrote {Path(args.out) / 'overhead.json'} and {Path(args.out) / 'overhead.png'}")
    return 0


def _bench_kernels(args: argparse.Namespace) -> int:
    from agent_gravity.bench import kernels

    report = kernels.main(args.device, args.dtype, args.repeats, Path(args.out))
    print(kernels.table(report))
    print(f"wrote {Path(args.out) / 'kernels.json'} and {Path(args.out) / 'kernels.png'}")
    return 0


_SAVINGS_METHODS = ("full", "window_mean", "ewma", "cusum", "loop", "probe", "default", "vllm_budget", "dynasor")


def _tasks(seed: int, items: int | None, free_text: int | None) -> list:
    """The benchmark's shipped items (seed 0), or another seed's without any question the benchmark asks."""
    from agent_gravity.bench.tasks import generate_tasks, load_tasks

    shipped = load_tasks()
    asked = {t.question for t in shipped}
    tasks = shipped if seed == 0 else [t for t in generate_tasks(seed) if t.question not in asked]
    graded = [t for t in tasks if t.answer is not None]
    free = [t for t in tasks if t.answer is None]
    return graded[:items] + free[:free_text]


def _family_tasks(per_family: int | None, families: list[str] | None, seed: int | None = None) -> list:
    """The shipped family set, or ``seed``'s without any question of the shipped set in any wording; ``per_family``
    items (whole twin pairs) of each family in ``families``."""
    from agent_gravity.bench.families import FAMILIES, benchmark_wordings, generate_families, load_families

    unknown = set(families or ()) - set(FAMILIES)
    if unknown:
        raise SystemExit(f"unknown families {sorted(unknown)}; choose from {sorted(FAMILIES)}")
    if per_family is not None and (per_family < 2 or per_family % 2):
        raise SystemExit("--per-family must be an even number of at least 2 (each question comes in two wordings)")
    if seed is not None:
        return generate_families(seed, per_family or 60, families, avoid=benchmark_wordings())
    tasks = [t for t in load_families() if families is None or t.kind in families]
    return [t for t in tasks if per_family is None or int(t.id.rsplit("-", 1)[1]) < per_family]


def _bench_savings(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from agent_gravity._chat_model import ChatGravity, local_backend
    from agent_gravity.bench import heldout, savings

    split = args.split == "leave-one-family-out"
    if split and args.tasks != "families":
        raise SystemExit("--split leave-one-family-out needs --tasks families (the shipped set has one family a kind)")
    grid = [c.name for c in heldout.GRID]
    if args.answers is not None:
        if not split:
            raise SystemExit("--answers re-analyses a split run: add --tasks families --split leave-one-family-out")
        report = heldout.main(heldout.load_experiment(Path(args.answers)), grid, args.epsilon, args.delta,
                              Path(args.out))
        return _print_report(args, report, heldout.table, "savings", "per_item")
    if args.baseline is not None and not split:
        raise SystemExit("--baseline reuses a split run's full answers: add --tasks families --split leave-one-family-out")
    baseline = heldout.load_experiment(Path(args.baseline)) if args.baseline is not None else None
    tasks = (_family_tasks(args.per_family, args.families) if args.tasks == "families"
             else _tasks(0, args.items, args.free_text))
    budgets = _budgets(args)
    if baseline is not None:
        heldout.check_baseline(baseline, tasks, budgets=budgets)
    steps = len(heldout.GRID) + 2 if split else len(args.methods)
    bar = tqdm(total=steps, desc="starting the vLLM engine", file=sys.stderr, unit="method")
    with contextlib.redirect_stdout(sys.stderr):
        backend = local_backend(args.model)
        model = ChatGravity(backend=backend)

        def advance(name: str, summary: dict) -> None:
            bar.set_description(f"{name}: {summary['reasoning_tokens']['value']:.1f} reasoning tokens/item")
            bar.update(1)

        def budget(n: int) -> savings.ThinkingBudgetBackend:
            return savings.ThinkingBudgetBackend(backend, n)

        if split:
            experiment = heldout.answer_all(model, tasks, args.concurrency, budget, heldout.GRID, advance, baseline,
                                            budgets)
            report = heldout.main(experiment, grid, args.epsilon, args.delta, Path(args.out))
        else:
            report = savings.main(model, tasks, args.methods, args.concurrency, budget, Path(args.out), advance,
                                  budgets)
    bar.close()
    return _print_report(args, report, heldout.table if split else savings.table, "savings", "per_item")


def _bench_route(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from agent_gravity._chat_model import ChatGravity, local_backend
    from agent_gravity.bench import route

    tasks, budgets = _family_tasks(args.per_family, args.families), _budgets(args)
    bar = tqdm(total=6, desc="starting the vLLM engine", file=sys.stderr, unit="arm")
    with contextlib.redirect_stdout(sys.stderr):
        model = ChatGravity(backend=local_backend(args.model))

        def advance(name: str) -> None:
            bar.set_description(f"{name} answered")
            bar.update(1)

        report = route.main(model, tasks, args.concurrency, args.cheap_reasoning_tokens, args.epsilon, args.delta,
                            Path(args.out), advance, budgets)
    bar.close()
    return _print_report(args, report, route.table, "route", "per_item")


def _print_report(args: argparse.Namespace, report: dict, table: Callable[[dict], str], name: str,
                  per_item: str) -> int:
    """Print a benchmark's report as JSON (without its per-item records) or as its table."""
    report["command"] = " ".join(["agent-gravity", *sys.argv[1:]])
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != per_item}))
    else:
        print(table(report))
        print(f"wrote {Path(args.out) / f'{name}.json'} and {Path(args.out) / f'{name}.png'}")
    return 0


def _bench_agents(args: argparse.Namespace) -> int:
    from agent_gravity._chat_model import ChatGravity
    from agent_gravity.bench import agents
    from agent_gravity.bench.agent_tasks import generate_agent_tasks

    if args.tasks < 1 or args.max_steps < 2 or args.concurrency < 1 or (
            args.low_entropy_steps is not None and args.low_entropy_steps < 1):
        raise SystemExit("--tasks, --concurrency and --low-entropy-steps must be at least 1, --max-steps at least 2")
    tasks = generate_agent_tasks(args.tasks, args.seed)
    with contextlib.redirect_stdout(sys.stderr):
        model = ChatGravity(model=args.model)
        model.get_backend()
        report = agents.main(model, tasks, args.concurrency, args.max_steps, args.low_entropy_steps, Path(args.out),
                             lambda arm: print(f"running the {arm} arm over {len(tasks)} tasks", file=sys.stderr))
    return _print_report(args, report, agents.table, "agents", "tasks")


def _transformers_backend(model: str | None, device: str = "cpu", max_model_len: int | None = None) -> Any:
    """The transformers backend on ``--model`` (a local folder) or the embedded model, on ``device``."""
    from agent_gravity import _model_store
    from agent_gravity.backends.local_transformers import TransformersBackend, TransformersSettings

    folder = _model_store.pull() if model is None else Path(model).expanduser().resolve()
    extra = {} if max_model_len is None else {"max_model_len": max_model_len}
    return TransformersBackend(TransformersSettings(str(folder), device=device, **extra),
                               None if model else _model_store.DEFAULT_MODEL.name)


def _bench_prefill(args: argparse.Namespace) -> int:
    from agent_gravity.backends._adaptive_prefill import PrefillSpec
    from agent_gravity.bench import prefill

    if args.per_cell < 1 or min(args.lengths) < 256 or min(args.break_even) < 256:
        raise SystemExit("--per-cell must be at least 1 and every --lengths/--break-even value at least 256 tokens")
    with contextlib.redirect_stdout(sys.stderr):
        backend = _transformers_backend(args.model, max_model_len=max(*args.lengths, *args.break_even) + 64)
        if max(*args.lengths, *args.break_even) > backend.max_positions:
            raise SystemExit(f"--lengths and --break-even go up to the model's context, {backend.max_positions} tokens")
        report = prefill.main(backend, args.lengths, args.per_cell, PrefillSpec(min_tokens=args.min_tokens),
                              args.kinds, args.break_even, Path(args.out),
                              lambda task: print(f"task {task.id}", file=sys.stderr))
    return _print_report(args, report, prefill.table, "prefill", "rows")


def _bench_prefill_speed(args: argparse.Namespace) -> int:
    from agent_gravity.bench import prefill_speed

    if min(args.lengths) < 1024 or not 0 <= args.sparse_share <= 1 or args.repeats < 1:
        raise SystemExit("--lengths must be at least 1024 tokens, --sparse-share within 0..1, --repeats at least 1")
    device = args.device or ("cuda" if _cuda_available() else "cpu")
    with contextlib.redirect_stdout(sys.stderr):
        report = prefill_speed.main(args.lengths, args.layers, args.sparse_share, args.repeats, device,
                                    Path(args.out), lambda n: print(f"{n} tokens", file=sys.stderr))
    return _print_report(args, report, prefill_speed.table, "prefill_speed", "none")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _bench_kv(args: argparse.Namespace) -> int:
    from agent_gravity.bench import kv
    from agent_gravity.bench.kv_tasks import generate_transcripts

    if args.transcripts < 1 or any(b <= 1 for b in args.budgets):
        raise SystemExit("--transcripts must be at least 1 and every --budgets value above 1 (2 4 8: x fewer bytes)")
    transcripts = generate_transcripts(args.transcripts, args.seed, args.noise_lines, args.families)
    with contextlib.redirect_stdout(sys.stderr):
        backend = _transformers_backend(args.model)
        report = kv.main(backend, transcripts, args.policies, args.budgets, Path(args.out),
                         lambda t: print(f"transcript {t}", file=sys.stderr))
    return _print_report(args, report, kv.table, "kv", "rows")


def _bench_groups(args: argparse.Namespace) -> int:
    from agent_gravity.bench import groups

    if args.items < 0 or args.per_kind < 0 or args.items + args.per_kind == 0:
        raise SystemExit("--items and --per-kind must be 0 or more, and not both 0")
    with contextlib.redirect_stdout(sys.stderr):
        backend = _transformers_backend(args.model, args.device)
        chosen = [groups.FULL, *[g for g in args.groups if g != groups.FULL]]
        report = groups.main(backend, args.items, args.per_kind, chosen, Path(args.out),
                             lambda s: print(s, file=sys.stderr))
    return _print_report(args, report, groups.table, "groups", "runs")


def _calibrate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from agent_gravity._calibrate import GRID, calibrate
    from agent_gravity._chat_model import ChatGravity
    from agent_gravity._profile import update_profile

    if args.layers:
        if (args.max_reasoning_tokens, args.max_answer_tokens) != (None, None):
            raise SystemExit("--layers measures answers of --layer-tokens tokens: it takes no --max-*-tokens")
        return _calibrate_layers(args)
    budgets = _budgets(args)
    if args.route:
        return _calibrate_route(args, budgets)
    unknown = set(args.candidates or ()) - {c.name for c in GRID}
    if unknown:
        raise SystemExit(f"unknown candidates {sorted(unknown)}; the grid is {[c.name for c in GRID]}")
    grid = [c for c in GRID if args.candidates is None or c.name in args.candidates]
    tasks = _family_tasks(args.per_family, args.families, args.seed)
    bar = tqdm(total=len(grid), desc="full run and references", file=sys.stderr, unit="candidate")
    with contextlib.redirect_stdout(sys.stderr):
        model = ChatGravity(model=args.model)

        def advance(name: str, results: list) -> None:
            bar.set_description(f"{name}: {sum(r.reasoning_tokens for r in results) / len(results):.1f} "
                                "reasoning tokens/item")
            bar.update(1)

        profile = calibrate(model, tasks, args.epsilon, args.delta, args.concurrency, grid, advance, budgets)
    bar.close()
    path = update_profile(profile.model, **{k: getattr(profile, k) for k in ("gravity", "calibration", "measured")})
    c = profile.calibration
    assert c is not None
    if c.bound_met:
        print(f"{profile.model}: candidate {c.candidate} certified: answer loss {c.loss:.1%} on {c.items} items "
              f"({len(c.families)} families), bound {c.bound:.1%} <= epsilon {c.epsilon:g} at delta {c.delta:g}; "
              f"reasoning saved {c.reasoning_saved:.1%}")
    else:
        print(f"{profile.model}: NO candidate met epsilon {c.epsilon:g} at delta {c.delta:g} on {c.items} items; "
              "the profile keeps the shipped defaults and says so")
    print(f"wrote {path}; ChatGravity loads it for this model unless given gravity=...")
    return 0


def _calibrate_route(args: argparse.Namespace, budgets: Any) -> int:
    from agent_gravity._calibrate import calibrate_route
    from agent_gravity._chat_model import ChatGravity
    from agent_gravity._profile import update_profile

    tasks = _family_tasks(args.per_family, args.families, args.seed)
    print(f"answering {len(tasks)} calibration items in full, with reasoning and directly", file=sys.stderr)
    with contextlib.redirect_stdout(sys.stderr):
        model = ChatGravity(model=args.model)
        found = calibrate_route(model, tasks, args.epsilon, args.delta, args.concurrency, budgets)
        name = model.get_backend().model_name
    path = update_profile(name, route=found)
    if found.direct_below is not None:
        print(f"{name}: direct answers under {found.direct_below:g} nats certified: {found.direct_share:.1%} of "
              f"{found.items} items answered directly, answer loss {found.loss:.1%} (bound {found.bound:.1%}), "
              f"reasoning saved {found.reasoning_saved:.1%}")
    else:
        print(f"{name}: NO direct-answer threshold met epsilon {found.epsilon:g} at delta {found.delta:g} on "
              f"{found.items} items; adaptive thinking will reason on every call, and the profile says so")
    print(f"wrote {path}; use it with RouteConfig(think='adaptive')")
    return 0


def _calibrate_layers(args: argparse.Namespace) -> int:
    from agent_gravity._config import ComputeConfig
    from agent_gravity._layer_search import LayerSearch, answer_samples, calibrate_layers
    from agent_gravity._profile import update_profile
    from agent_gravity.bench.structured_tasks import generate_structured_tasks

    if args.layer_questions < 2 or args.layer_tokens < 8 or not 0 < args.skip_agreement <= 1:
        raise SystemExit("--layer-questions must be at least 2, --layer-tokens at least 8, and --skip-agreement in "
                         "(0, 1]")
    half = args.layer_questions // 2
    one_wording = {t.pair or t.id: t.question for t in _family_tasks(2, args.families, args.seed)}
    family = list(one_wording.values())[:args.layer_questions - half]
    structured = [t.question for t in generate_structured_tasks(half, args.seed)][:half]
    compute = ComputeConfig().spec()
    with contextlib.redirect_stdout(sys.stderr):
        backend = _transformers_backend(args.model)
        layers = backend.num_layers
        most = layers // 2 if args.max_skip is None else args.max_skip
        if not 1 <= most < layers:
            raise SystemExit(f"--max-skip must be between 1 and {layers - 1} for this model")
        print(f"answering {len(family) + len(structured)} calibration questions", file=sys.stderr)
        search = LayerSearch(answer_samples(backend, [*family, *structured], args.layer_tokens, compute),
                             lambda prompt, output, skip: backend.forced(prompt, output, skip)[0])
        print(f"searching over {layers} layers on {search.positions} zone positions", file=sys.stderr)
        found = calibrate_layers(search, layers, compute, most, args.skip_agreement, args.max_draft)
    path = update_profile(backend.model_name, layers=found)
    for step in found.path:
        print(f"skip {len(step.layers):>2} layers {list(step.layers)}: top-1 agreement in zones {step.agreement:.1%}")
    drafts = (f"draft layers {list(found.draft_layers)} (modelled speedup {found.modelled_speedup:.2f}x at drafts "
              f"of {found.draft_length})" if found.draft_layers else "no layer set drafts faster than context "
              "drafts alone: layer drafts stay off")
    skips = (f"skip layers {list(found.skip_layers)}" if found.skip_layers else
             f"no layer set keeps {found.skip_target:.0%} agreement: lossy skipping needs layers named by hand")
    print(f"{drafts}; {skips}\nwrote {path}; use them with SpeculationConfig(layers='profile') or "
          "LayerSkipConfig(layers='profile')")
    return 0


def _report(args: argparse.Namespace) -> int:
    from agent_gravity._entropy_report import render_report

    print(render_report(args.trace, args.out))
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    from agent_gravity._dashboard import run_dashboard

    return run_dashboard(Path(args.workdir), args.port, detach=args.detach, stop=args.stop)


def _serve(args: argparse.Namespace) -> int:
    from agent_gravity import ChatGravity, RouteConfig
    from agent_gravity.serve import run_server

    api_key = _secret(args.api_key_env)
    if args.upstream and args.upstream_tier:
        raise ValueError("give either --upstream (one model) or --upstream-tier (a cascade), not both")
    if args.upstream_tier:
        model = ChatGravity(tiers=_tiers(args.upstream_tier, _secret(args.upstream_api_key_env)),
                            route=RouteConfig(**({} if args.escalate_above is None
                                                 else {"escalate_above": args.escalate_above})))
    elif args.upstream:
        model = ChatGravity(base_url=args.upstream, model=args.model, api_key=_secret(args.upstream_api_key_env))
    else:
        model = ChatGravity(model=args.model)
    run_server(model, args.host, args.port, api_key, args.max_body_bytes, allow_public=args.allow_public,
               client_settings=[name.strip() for name in args.client_settings.split(",") if name.strip()],
               max_concurrency=args.max_concurrency, request_timeout=args.request_timeout or None)
    return 0


def _tiers(specs: list[str], api_key: str | None) -> list:
    """``NAME=URL`` options (cheapest first; a name given again adds a server to that tier) as cascade tiers."""
    from agent_gravity._config import Tier

    urls: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or not name.strip() or not url.strip():
            raise ValueError(f"--upstream-tier takes NAME=URL (e.g. cheap=http://127.0.0.1:8001/v1), got {spec!r}")
        urls.setdefault(name.strip(), []).append(url.strip())
    if len(urls) < 2:
        raise ValueError(f"--upstream-tier needs at least two tiers, cheapest first; got {sorted(urls)}")
    return [Tier(name=name, base_url=found, api_key=api_key) for name, found in urls.items()]


def _secret(variable: str | None) -> str | None:
    """A key read from an environment variable (keys on the command line would show in ``ps``)."""
    if variable is None:
        return None
    value = os.environ.get(variable)
    if not value:
        raise ValueError(f"the environment variable {variable} is not set or empty; export the key there")
    return value


def _bench_serve(args: argparse.Namespace) -> int:
    from agent_gravity.bench import serve

    with contextlib.redirect_stdout(sys.stderr):
        report = serve.main(Path(args.out), args.streams, args.requests, args.rounds, args.tokens, args.batch,
                            lambda msg: print(msg, file=sys.stderr))
    return _print_report(args, report, serve.table, "serve", "per_request")


def _bench_soak(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from agent_gravity.bench import soak

    bar = tqdm(total=args.requests, desc="starting", file=sys.stderr, unit="request")

    def advance(message: str) -> None:
        bar.set_description(message)
        if message.endswith("requests"):
            bar.n = int(message.split("/")[0])
            bar.refresh()

    with contextlib.redirect_stdout(sys.stderr):
        report = soak.main(Path(args.out), args.requests, args.concurrency, args.seed, args.model, advance)
    bar.close()
    return _print_report(args, report, soak.table, "soak", "per_request")


_KV_POLICIES = ("reconstruction", "head_entropy", "snapkv", "streaming_llm", "snapkv_protect", "int8_gravity",
                "head_entropy_int8", "reconstruction_int8")
"""bench kv's policies (agent_gravity.bench.kv.POLICIES), listed here so that --help needs no torch."""
_GROUPS = ("full", "lossless", "lossless+layers", "never-zone", "kv8", "kv4", "skip", "skip+kv8", "skip10", "top2")
"""bench groups' groups (agent_gravity.bench.groups.GROUPS), listed here for the same reason."""


def _report_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """The options every report-writing benchmark takes: the model, JSON output and the output folder."""
    parser.add_argument("--model", help="a local model folder (default: the embedded model)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    parser.add_argument("--out", default="artifacts/bench", help=f"folder for {name}.json and {name}.png")


def build_parser() -> argparse.ArgumentParser:
    from agent_gravity.bench.kv_tasks import FAMILIES as KV_FAMILIES  # stdlib only: --help stays light

    parser = argparse.ArgumentParser(prog="agent-gravity", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="answer a few reasoning questions with gravity off and on")
    demo.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    demo.add_argument("--model", help="a local model folder (default: the embedded SmolLM2-135M-Instruct)")
    demo.add_argument("-v", "--verbose", action="store_true",
                      help="show the engine's log here (default: it goes to a file whose path is printed)")
    demo.set_defaults(run=_demo)
    model = commands.add_parser("model", help="manage the embedded model")
    model_commands = model.add_subparsers(dest="model_command", required=True)
    pull = model_commands.add_parser("pull", help="fetch, verify and convert the embedded model; print its folder")
    pull.set_defaults(run=_model_pull)
    bench = commands.add_parser("bench", help="measure, as ratios against a baseline in the same run")
    benches = bench.add_subparsers(dest="bench_command", required=True)
    over = benches.add_parser("overhead", help="decode throughput with the gravity processor working vs idle")
    over.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes (default: 1 8)")
    over.add_argument("--rounds", type=int, default=6, help="alternating round pairs per batch size")
    over.add_argument("--tokens", type=int, default=64, help="tokens generated per request")
    over.add_argument("--model", help="a local model folder (default: the embedded model)")
    over.add_argument("--out", default="artifacts/bench", help="folder for overhead.json and overhead.png")
    over.set_defaults(run=_bench_overhead)
    kern = benches.add_parser("kernels", help="token_entropy against torch eager and torch.compile")
    kern.add_argument("--device", default="auto", help="cuda, cpu or auto")
    kern.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    kern.add_argument("--repeats", type=int, default=50)
    kern.add_argument("--out", default="artifacts/bench", help="folder for kernels.json and kernels.png")
    kern.set_defaults(run=_bench_kernels)
    sav = benches.add_parser("savings", help="tokens saved against answers kept: every method, one engine")
    sav.add_argument("--items", type=int, default=None, help="reasoning items to use (default: all 210)")
    sav.add_argument("--free-text", type=int, default=None, help="free-text items to use (default: all 30)")
    sav.add_argument("--methods", nargs="+", default=list(_SAVINGS_METHODS), choices=_SAVINGS_METHODS,
                     help="methods to run (default: all); full always runs, as the reference")
    sav.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    _budget_arguments(sav)
    sav.add_argument("--tasks", choices=["shipped", "families"], default="shipped",
                     help="the shipped task set (default), or the held-out families (several wordings each)")
    sav.add_argument("--split", choices=["none", "leave-one-family-out"], default="none",
                     help="leave-one-family-out: calibrate on every family but one, report on the one left out")
    sav.add_argument("--per-family", type=int, default=None, help="items per family (even; default: all 60)")
    sav.add_argument("--families", nargs="+", default=None, help="families to use (default: all)")
    sav.add_argument("--epsilon", type=float, default=0.05, help="answer loss the calibration may allow (0.05)")
    sav.add_argument("--delta", type=float, default=0.1, help="chance the guarantee may fail (0.1)")
    sav.add_argument("--answers", metavar="SAVINGS_JSON", default=None,
                     help="with --split: analyse the answers a split run saved instead of running the model")
    sav.add_argument("--baseline", metavar="SAVINGS_JSON", default=None,
                     help="with --split: reuse the full and 4x-reference answers of an earlier split run of the same "
                          "items and model (gravity does not touch them); the steered methods run again")
    _report_arguments(sav, "savings")
    sav.set_defaults(run=_bench_savings)
    rte = benches.add_parser("route", help="adaptive thinking and tiers against random and prompt-length routing")
    rte.add_argument("--per-family", type=int, default=None, help="items per family (even; default: all 60)")
    rte.add_argument("--families", nargs="+", default=None, help="families to use (default: all)")
    rte.add_argument("--cheap-reasoning-tokens", type=int, default=32,
                     help="the cheap tier's reasoning budget (default 32; the others have --max-reasoning-tokens)")
    rte.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    _budget_arguments(rte)
    rte.add_argument("--epsilon", type=float, default=0.05, help="answer loss the direct threshold may allow (0.05)")
    rte.add_argument("--delta", type=float, default=0.1, help="chance the guarantee may fail (0.1)")
    _report_arguments(rte, "route")
    rte.set_defaults(run=_bench_route)
    agt = benches.add_parser("agents", help="a create_agent tool agent with and without GravityMiddleware")
    agt.add_argument("--tasks", type=int, default=60, help="seeded multi-step tasks to run (default 60)")
    agt.add_argument("--seed", type=int, default=7, help="task-set seed (default 7)")
    agt.add_argument("--max-steps", type=int, default=8, help="model calls per run in both arms (default 8)")
    agt.add_argument("--low-entropy-steps", type=int, default=None,
                     help="also end after K steps whose peak entropy stays low (default: off)")
    agt.add_argument("--concurrency", type=int, default=8, help="agent runs in flight at once")
    _report_arguments(agt, "agents")
    agt.set_defaults(run=_bench_agents)
    kvp = benches.add_parser("kv", help="KV trim policies: bytes held against exact-value recall and agreement")
    kvp.add_argument("--transcripts", type=int, default=4, help="seeded transcripts per family (default 4)")
    kvp.add_argument("--families", nargs="+", default=list(KV_FAMILIES), choices=KV_FAMILIES,
                     help="transcript families, each worded its own way (default: all five)")
    kvp.add_argument("--seed", type=int, default=11)
    kvp.add_argument("--noise-lines", type=int, default=30,
                     help="noise units (log lines, records, rows, sentences, settings) around each value (default 30)")
    kvp.add_argument("--policies", nargs="+", default=list(_KV_POLICIES), choices=_KV_POLICIES)
    kvp.add_argument("--budgets", type=float, nargs="+", default=[2, 4, 8], help="x fewer bytes to hold")
    _report_arguments(kvp, "kv")
    kvp.set_defaults(run=_bench_kv)
    pre = benches.add_parser("prefill", help="entropy-adaptive prefill against dense and fixed sparse attention: "
                                             "speed, recall, top-1 agreement and KL on long prompts")
    pre.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192], help="context lengths (tokens)")
    pre.add_argument("--per-cell", type=int, default=1, help="tasks per length, depth and kind (default 1)")
    pre.add_argument("--kinds", nargs="+", default=["logs", "prose", "two_hop"], choices=["logs", "prose", "two_hop"])
    pre.add_argument("--min-tokens", type=int, default=4096,
                     help="prompts shorter than this prefill densely (default 4096: measured below it, adaptive is slower)")
    pre.add_argument("--break-even", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192],
                     help="lengths at which dense and adaptive prefill are timed against each other")
    _report_arguments(pre, "prefill")
    pre.set_defaults(run=_bench_prefill)
    spd = benches.add_parser("prefill-speed", help="the prepared GPU run: adaptive prefill against dense attention "
                                                   "on a random-weight Llama 3.2 1B up to 128K tokens, speed only")
    spd.add_argument("--lengths", type=int, nargs="+", default=[16384, 32768, 65536, 131072],
                     help="context lengths (tokens)")
    spd.add_argument("--layers", type=int, default=16, help="decoder layers of the architecture's 16 (default 16)")
    spd.add_argument("--sparse-share", type=float, default=0.75,
                     help="share of each layer's heads the fixed-split arm makes sparse (default 0.75)")
    spd.add_argument("--repeats", type=int, default=2, help="timed runs per arm after a warm-up (best kept)")
    spd.add_argument("--device", help="torch device (default: cuda when there is one, else cpu)")
    spd.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    spd.add_argument("--out", default="artifacts/bench", help="folder for prefill_speed.json and prefill_speed.png")
    spd.set_defaults(run=_bench_prefill_speed)
    grp = benches.add_parser("groups", help="compute groups inside gravity zones (lossless drafting, KV in 8 or 4 "
                                            "bits, skipped layers, top-2) against the full group, on the "
                                            "transformers backend")
    grp.add_argument("--items", type=int, default=60, help="savings-set reasoning items (default 60; 0: none)")
    grp.add_argument("--per-kind", type=int, default=15,
                     help="long structured outputs per kind, 4 kinds (default 15; 0: none)")
    grp.add_argument("--groups", nargs="+", default=list(_GROUPS), choices=_GROUPS,
                     help="groups to run (default: all); full always runs, as the reference; top2 runs on the "
                          "savings items at temperature 0.7")
    grp.add_argument("--device", default="cpu", help="torch device of the transformers backend (default cpu; cuda "
                                                     "on a GPU)")
    _report_arguments(grp, "groups")
    grp.set_defaults(run=_bench_groups)
    srv = benches.add_parser("serve", help="the vLLM plugin's overhead, and the gravity proxy under load")
    srv.add_argument("--streams", type=int, default=64, help="concurrent streams through the proxy (default 64)")
    srv.add_argument("--requests", type=int, default=256, help="requests through the proxy (default 256)")
    srv.add_argument("--rounds", type=int, default=8, help="alternating overhead rounds (default 8)")
    srv.add_argument("--tokens", type=int, default=64, help="tokens per overhead request (default 64)")
    srv.add_argument("--batch", type=int, default=16, help="concurrent requests per overhead batch (default 16)")
    srv.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    srv.add_argument("--out", default="artifacts/bench", help="folder for serve.json, serve.png and server logs")
    srv.set_defaults(run=_bench_serve)
    soak = benches.add_parser("soak", help="the gravity proxy under a long mixed load: plain, streams, tools, "
                                         "structured output, clients that leave and bad bodies")
    soak.add_argument("--requests", type=int, default=2000, help="requests through the proxy (default 2000)")
    soak.add_argument("--concurrency", type=int, default=16, help="requests in flight at once (default 16)")
    soak.add_argument("--seed", type=int, default=0, help="the mix of request kinds (default 0)")
    _report_arguments(soak, "soak")
    soak.set_defaults(run=_bench_soak)
    rep = commands.add_parser("report", help="render an entropy trace file as an HTML report with PNG figures")
    rep.add_argument("trace", help="a JSONL entropy trace (TelemetryConfig(trace_file=...) or entropy_trace())")
    rep.add_argument("--out", default="artifacts/report", help="folder for report.html and its PNGs")
    rep.set_defaults(run=_report)
    dash = commands.add_parser("dashboard", help="start a Phoenix tracing dashboard on loopback for our spans")
    dash.add_argument("--workdir", default=str(Path.home() / ".agent-gravity" / "phoenix"),
                      help="Phoenix's working directory (its database lives there)")
    dash.add_argument("--port", type=int, default=6006, help="HTTP port on 127.0.0.1 (default 6006)")
    dash.add_argument("--detach", action="store_true", help="leave it running in the background and return")
    dash.add_argument("--stop", action="store_true", help="stop the dashboard started with --detach")
    dash.set_defaults(run=_dashboard)
    serve = commands.add_parser("serve", help="the gravity proxy: an OpenAI-compatible server for any agent")
    serve.add_argument("--upstream", action="append",
                       help="an OpenAI-compatible server (repeat for several serving the same model); "
                            "default: the local vLLM engine")
    serve.add_argument("--upstream-tier", action="append", metavar="NAME=URL",
                       help="a cascade tier's server, cheapest tier first (repeat; at least two tiers): each call "
                            "starts on the first and goes up while its output's entropy is high")
    serve.add_argument("--escalate-above", type=float, default=None,
                       help="--upstream-tier: send a call up when its output's 0.9 entropy quantile is above this "
                            "many nats (default: RouteConfig's)")
    serve.add_argument("--model", help="the upstream's served model name, or a local model folder without "
                                       "--upstream (default: the embedded model)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key-env", metavar="VAR", help="require the key in this environment variable")
    serve.add_argument("--upstream-api-key-env", metavar="VAR", help="the upstreams' key, from this variable")
    serve.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024, help="larger bodies get 413")
    serve.add_argument("--allow-public", action="store_true",
                       help="bind a non-loopback address without an API key")
    serve.add_argument("--client-settings", default="enabled,max_reasoning_tokens,max_answer_tokens",
                       metavar="FIELDS", help="GravityConfig fields a request's `gravity` may change, comma-separated "
                                              "(default: enabled and the budgets, never above the server's); "
                                              "others get 400")
    serve.add_argument("--max-concurrency", type=int, default=128,
                       help="chat completions in flight at once; more get 503 with Retry-After (default 128)")
    serve.add_argument("--request-timeout", type=float, default=600.0, metavar="SECONDS",
                       help="a chat completion running longer gets 504 and its backend call is aborted "
                            "(default 600; 0: no limit)")
    serve.set_defaults(run=_serve)
    cal = commands.add_parser("calibrate", help="certify the most saving exit settings at a bounded answer loss; "
                                                "save a model profile")
    cal.add_argument("--epsilon", type=float, default=0.05, help="expected share of lost answers allowed (0.05)")
    cal.add_argument("--delta", type=float, default=0.1, help="chance the guarantee may fail (0.1)")
    cal.add_argument("--per-family", type=int, default=20, help="calibration items per family (even; default 20)")
    cal.add_argument("--families", nargs="+", default=None, help="task families to calibrate on (default: all)")
    cal.add_argument("--seed", type=int, default=12, help="task seed (default 12; the benchmark's set is excluded)")
    cal.add_argument("--candidates", nargs="+", default=None, help="grid candidates to try, in the grid's order "
                                                                   "(default: all)")
    cal.add_argument("--concurrency", type=int, default=8)
    cal.add_argument("--model", help="a local model folder (default: the embedded model)")
    _budget_arguments(cal)
    cal.add_argument("--layers", action="store_true",
                     help="instead of the exit settings, choose the decoder layers to do without inside gravity zones "
                          "(layer drafts and lossy skipping) on the transformers backend; kept in the same profile")
    cal.add_argument("--route", action="store_true",
                     help="instead of the exit settings, certify the direct-answer threshold of adaptive thinking "
                          "(RouteConfig(think='adaptive')); kept in the same profile")
    cal.add_argument("--layer-questions", type=int, default=12, help="--layers: calibration questions (default 12)")
    cal.add_argument("--layer-tokens", type=int, default=128, help="--layers: tokens per answer (default 128)")
    cal.add_argument("--max-skip", type=int, default=None, help="--layers: most layers searched (default: half)")
    cal.add_argument("--skip-agreement", type=float, default=0.95,
                     help="--layers: top-1 agreement in zones lossy skipping must keep (default 0.95)")
    cal.add_argument("--max-draft", type=int, default=8, help="--layers: longest draft modelled (default 8)")
    cal.set_defaults(run=_calibrate)
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
