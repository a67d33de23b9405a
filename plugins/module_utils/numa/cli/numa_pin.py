"""``numa-pin``: plan, apply and exec — the helper a systemd unit's ExecStart runs.

    numa-pin facts   [--root DIR]
    numa-pin explain [REQUEST] [--root DIR]
    numa-pin exec    [REQUEST] [--best-effort] -- SERVER ARGS...
    numa-pin metrics [--textfile-dir DIR | --stdout | --json]

``exec`` reads this host's topology, plans the placement, sets the CPU affinity
and memory policy of this very process (both survive execve), exports the
plan's environment, substitutes ``{threads} {node} {cpulist} {instance}
{port}`` in SERVER ARGS, writes one line to stderr and replaces itself with the
server: same PID, so systemd's MainPID, signals and Type=notify stay the
server's. It is strict by default: a refused syscall stops the start with a
message and exit code 3, never a server silently running unpinned.

Exit codes: 0 ok, 1 audit below target, 2 bad request or impossible plan,
3 kernel refused the placement, 127 server not found.
"""

from __future__ import annotations

import os
import sys

from ..base.errors import NumaError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds at every unit start; annotations only
    import argparse
    from typing import Any, Dict, List, Optional, Set, Tuple, Union

    from ..decide.placement import Plan
    from ..inputs.request import Option

    # What facts, explain and exec get: argparse's Namespace, or _quick_parse's look-alike.
    Args = Union[argparse.Namespace, "_Args"]
    # _quick_parse's flags: those taking a value (flag -> dest, its request option or None),
    # and the switches (flag -> dest, the value it sets).
    Takes = Dict[str, Tuple[str, Optional[Option]]]
    Sets = Dict[str, Tuple[str, bool]]

# The collection's version (galaxy.yml; tests/unit/test_cli.py holds them equal).
VERSION = "1.3.0"
EXIT_AUDIT_FAILED = 1
EXIT_BAD_REQUEST = 2
EXIT_KERNEL_REFUSED = 3
EXIT_NOT_FOUND = 127
EXIT_CODES = ("exit codes: 0 ok, 1 audit below target, 2 bad request or impossible plan, 3 the kernel refused the "
              "placement (exec without --best-effort), 127 server not found")
TOKENS_HELP = ("In SERVER ARGS, {threads} {node} {cpulist} {instance} {port} become the plan's CPU count, anchor "
               "node, CPU list, instance number and port (--port-base + instance).")
EXPLAIN_EXAMPLE = "numa-pin explain --model /srv/models/model.gguf --instances 2 --instance 1"
EXEC_EXAMPLE = "numa-pin exec --node 0 --port-base 8080 -- llama-server -t {threads} --port {port}"
# Each command's --help ends with the exit codes it can give and an example.
COMMAND_HELP = {
    "facts": ("0 ok, 2 the root cannot be read", "numa-pin facts --root /srv/captured/dual-xeon"),
    "explain": ("0 ok, 2 bad request or impossible plan", EXPLAIN_EXAMPLE),
    "exec": ("none once the server runs (it is the server), 2 bad request or impossible plan, 3 the kernel refused "
             "the placement (without --best-effort), 127 server not found", EXEC_EXAMPLE),
    "audit": ("0 ok, 1 audit below target, 2 bad request or nothing to audit",
              "numa-pin audit --unit llama@0.service --plan-file /etc/inferops-numa/llama@0.plan.json"),
    "cost": ("0 ok, 2 bad request or nothing could be measured",
             "numa-pin cost --unit llama@0.service --plan-file /etc/inferops-numa/llama@0.plan.json"),
    "metrics": ("0 ok, 2 bad request or the textfile could not be written", "numa-pin metrics --stdout"),
    "irqs": ("0 ok, 2 the table cannot be trusted or read, 3 the kernel refused an affinity", "numa-pin irqs"),
}
# What each request option's value looks like in --help (argparse would show the option's name in capitals).
METAVARS = {"node": "ID|auto", "gpus": "auto|none|N|ADDR,...", "model_size": "SIZE|PATH", "model": "PATH",
            "memory_headroom": "SIZE", "reserve_cpus": "CPULIST", "instances": "N", "instance": "I",
            "replica_dir": "DIR", "port_base": "PORT", "anchors": "NODE,...", "min_local_percent": "PERCENT"}


def main(argv: Optional[List[str]] = None) -> int:
    args, server_argv = _parse(sys.argv[1:] if argv is None else argv)
    try:
        return args.run(args, server_argv)
    except NumaError as exc:
        _say(str(exc))
        return getattr(exc, "exit_code", EXIT_BAD_REQUEST)


def run() -> None:
    """numa-pin as a process of its own (the installed launcher, ``python3 -m numa``): main(), then
    exit without tearing the interpreter down.

    Teardown frees every module and object one by one: ~2 ms, a tenth of ``numa-pin facts`` on a
    large machine. numa-pin registers no exit handlers and starts no threads; its output is flushed
    first, and a flush that fails (a closed pipe) leaves the exit to the interpreter, as before.
    """
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        raise SystemExit(code)
    os._exit(code)


# --- argument parsing -----------------------------------------------------


def _parse(argv: List[str]) -> Tuple[Args, List[str]]:
    own, server_argv = _split_server_argv(argv)
    args = _quick_parse(own, server_argv)
    if args is not None:
        return args, server_argv
    parser = _parser(own[0] if own else None)
    args, unknown = parser.parse_known_args(own)
    if unknown:  # named by the command's own usage, not numa-pin's
        parser.commands[args.command].error("unrecognized arguments: %s" % " ".join(unknown))
    if args.command == "exec" and not server_argv:
        parser.error("exec needs the server command after '--', e.g. numa-pin exec --node 0 -- llama-server -t {threads}")
    if args.command != "exec" and server_argv:
        parser.error("only exec takes a server command after '--'")
    return args, server_argv


def _split_server_argv(argv: List[str]) -> Tuple[List[str], List[str]]:
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


class _Args:
    """What argparse's Namespace holds, for a command line _quick_parse took (vars() reads it alike)."""


def _quick_parse(own: List[str], server_argv: List[str]) -> Optional[_Args]:
    """A plain ``exec``, ``explain`` or ``facts`` command line, parsed as argparse would; else None.

    Every service start runs ``numa-pin exec`` with the flags a unit writes, and argparse (with
    the re, gettext and shutil it imports) would cost more than the rest of the start. Only
    flags spelled out in full, each value in the next word, are taken here; anything else
    (help, abbreviations, ``--flag=value``, a value starting with "-", a bad value, a missing
    or stray server command) returns None, and argparse parses the line and words any error.
    """
    command = own[0] if own else None
    if command not in ("exec", "explain", "facts") or (command == "exec") != bool(server_argv):
        return None
    args = _Args()
    takes, sets = _quick_flags(command, args)
    words = iter(own[1:])
    for word in words:
        if word in sets:
            setattr(args, *sets[word])
            continue
        if word not in takes:
            return None
        dest, option = takes[word]
        value = _quick_value(option, next(words, None))
        if value is None:
            return None
        if option is not None and option.kind == "list":
            getattr(args, dest).append(value)
        else:
            setattr(args, dest, value)
    return args


def _quick_flags(command: str, args: _Args) -> Tuple[Takes, Sets]:
    """Set the command's defaults on ``args``, as _parser's subcommand would; return its flags."""
    args.command = command
    args.run = {"facts": run_facts, "explain": run_explain, "exec": run_exec}[command]
    args.root = "/"
    takes = {}  # type: Takes
    sets = {}  # type: Sets
    if command != "exec":
        takes["--root"] = ("root", None)
    if command == "facts":
        return takes, sets
    from ..inputs.request import OPTIONS

    for option in OPTIONS:
        if option.kind == "bool":
            setattr(args, option.name, option.default)
            sets[option.flag] = (option.name, True)
            sets[option.negative_flag] = (option.name, False)
        else:
            setattr(args, option.name, option.fresh_default())
            takes[option.flag] = (option.name, option)
    if command == "exec":
        args.best_effort = False
        sets["--best-effort"] = ("best_effort", True)
    return takes, sets


def _quick_value(option: Optional[Option], word: Optional[str]) -> Any:
    """What argparse would store for ``word`` after the option's flag; None where argparse would
    refuse it or read the word as a flag."""
    if word is None or word.startswith("-"):
        return None
    if option is None:
        return word
    if option.kind == "int":
        try:
            return int(word)
        except ValueError:
            return None
    if option.choices and word not in option.choices:
        return None
    return word


def _parser(command: Optional[str]) -> argparse.ArgumentParser:
    import argparse
    from textwrap import fill

    text = argparse.RawDescriptionHelpFormatter  # keeps the examples' lines; the prose is filled here
    exit_codes = fill(EXIT_CODES, 79, subsequent_indent="  ")
    parser = argparse.ArgumentParser(
        prog="numa-pin", description="Place an inference server on the right NUMA node, CPUs and GPUs.",
        epilog="%s\n\nexamples:\n  %s\n  %s\n\n'numa-pin COMMAND --help' describes a command's options."
               % (exit_codes, EXPLAIN_EXAMPLE, EXEC_EXAMPLE),
        formatter_class=text)
    parser.add_argument("--version", action="version", version="numa-pin %s (inferops.numa)" % VERSION)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    facts = commands.add_parser("facts", help="print this host's topology as JSON (same as numa_facts)",
                                epilog=_epilog("facts"), formatter_class=text)
    facts.add_argument("--root", default="/", metavar="DIR", help="read sys/ and proc/ under DIR (a captured machine)")
    facts.set_defaults(run=run_facts)

    explain = commands.add_parser("explain", help="print the placement plan as JSON, change nothing",
                                  epilog=_epilog("explain"), formatter_class=text)
    _add_request_options(explain)
    explain.add_argument("--root", default="/", metavar="DIR", help="plan for the machine captured under DIR")
    explain.set_defaults(run=run_explain)

    execute = commands.add_parser(
        "exec", help="apply the plan to this process, then exec the server", formatter_class=text,
        description=fill("Plan, set this process's CPU affinity and memory policy, export the plan's environment, "
                         "then exec SERVER ARGS (same PID). " + TOKENS_HELP, 79),
        epilog=_epilog("exec"))
    _add_request_options(execute)
    execute.add_argument("--best-effort", action="store_true",
                         help="if the kernel refuses, degrade bind -> preferred -> CPU affinity only -> none "
                              "instead of failing")
    execute.set_defaults(run=run_exec, root="/")
    execute.usage = execute.format_usage()[len("usage: "):].rstrip() + " -- SERVER [ARGS...]"

    audit = commands.add_parser("audit", help="where a running service's pages and threads really are",
                                epilog=_epilog("audit"), formatter_class=text)
    audit.add_argument("--pid", type=int, action="append", default=[], metavar="PID",
                       help="a process to audit (repeatable)")
    audit.add_argument("--unit", metavar="NAME", help="a systemd unit: audits every process of its cgroup")
    audit.add_argument("--plan-file", metavar="FILE",
                       help="the plan file the service was started with (expected nodes and CPUs)")
    _add_judging_options(audit)
    audit.add_argument("--wait-seconds", type=float, default=0.0, metavar="SECONDS",
                       help="wait this long (at most a day, 86400) for the unit to be active and its memory "
                            "to settle")
    audit.set_defaults(run=run_audit)

    cost = commands.add_parser("cost", help="measure remote vs local memory latency and bandwidth per node pair",
                               epilog=_epilog("cost"), formatter_class=text)
    if command == "cost":  # the measurement engine is not imported on the exec path
        from .cost_command import add_arguments
        add_arguments(cost)
    cost.set_defaults(run=run_cost)

    metrics = commands.add_parser("metrics", help="write Prometheus metrics of every deployed instance's locality "
                                                  "and the host's NUMA state (node_exporter textfile)",
                                  epilog=_epilog("metrics"), formatter_class=text)
    if command == "metrics":  # like cost: its code stays off the exec path
        from .metrics_command import add_arguments as add_metrics_arguments
        add_metrics_arguments(metrics)
    metrics.set_defaults(run=run_metrics)

    irqs = commands.add_parser("irqs", help="serve the devices' interrupts on the CPUs numa_irqs's table gives them "
                                            "(what inferops-numa-irqs.service runs at boot)",
                               epilog=_epilog("irqs"), formatter_class=text)
    irqs.add_argument("--root", default="/", metavar="DIR", help="the host's files under DIR (a test tree)")
    irqs.set_defaults(run=run_irqs)
    parser.commands = commands.choices  # type: ignore[attr-defined]
    return parser


def _epilog(command: str) -> str:
    from textwrap import fill

    codes, example = COMMAND_HELP[command]
    return "%s\n\nexample:\n  %s" % (fill("exit codes: " + codes, 79, subsequent_indent="  "), example)


def _add_request_options(parser: argparse.ArgumentParser) -> None:
    from ..inputs.request import OPTIONS

    group = parser.add_argument_group("placement request (module options share these names)")
    for option in OPTIONS:
        _add_request_option(group, option)


def _add_judging_options(parser: argparse.ArgumentParser) -> None:
    from ..inputs.judging import OPTIONS

    group = parser.add_argument_group("judging (numa_audit and the role's entries share these)")
    for option in OPTIONS:
        _add_request_option(group, option)


def _add_request_option(group: Any, option: Option) -> None:
    """One option of a table (request.py's, judging.py's); its default is the table's, so --help shows it."""
    text = option.help.replace("%", "%%")  # argparse formats help with %
    if option.default is not None and option.kind != "list":
        text += " (default: %(default)s)"
    if option.kind == "bool":
        group.add_argument(option.flag, dest=option.name, action="store_true", default=option.default, help=text)
        group.add_argument(option.negative_flag, dest=option.name, action="store_false",
                           help="the opposite of %s" % option.flag)
        return
    settings: Dict[str, Any] = {"dest": option.name, "default": option.fresh_default(), "help": text}
    if option.name in METAVARS:
        settings["metavar"] = METAVARS[option.name]
    if option.choices:
        settings["choices"] = option.choices
    if option.kind in ("int", "float"):
        settings["type"] = int if option.kind == "int" else float
    elif option.kind == "list":
        settings["action"] = "append"
    group.add_argument(option.flag, **settings)


# --- requests -------------------------------------------------------------


def _plan(root: str, args: Args, plan_only: bool = False) -> Tuple[Dict[str, Any], Plan]:
    from ..decide.placement import plan
    from ..inputs.request import build_request
    from ..read.topology import read

    request = build_request(vars(args))
    topology = read(root, plan_only, cpu_kinds=not plan_only or request.cores == "fast")
    return topology, plan(topology, request)


# --- commands -------------------------------------------------------------


def run_facts(args: Args, _server_argv: List[str]) -> int:
    from ..read.topology import read

    _print_json(read(args.root))
    return 0


def run_explain(args: Args, _server_argv: List[str]) -> int:
    topology, placement = _plan(args.root, args)
    result = placement.to_dict()
    result["topology_warnings"] = topology["warnings"]
    if os.path.realpath(args.root) == "/" and placement.engine["requires"]:
        from ..base.engines import missing_programs

        # What numa-pin exec would refuse to start without, on this host.
        result["engine"]["missing"] = missing_programs(placement.engine["requires"], os.environ.get("PATH", os.defpath))
    if args.model:
        from ..act.pagecache import residency

        try:
            result["page_cache"] = residency(args.model)
        except NumaError as exc:  # the plan stands; only the look at the cache failed
            result["page_cache"] = {"error": str(exc)}
        result["page_cache"]["action"] = _page_cache_action(args.page_cache, placement.policy)
        if result["page_cache"]["action"] == "replicate":
            result["page_cache"]["replicas"] = _replica_paths(args.model, placement, args.replica_dir)
    _print_json(result)
    return 0


def run_exec(args: Args, server_argv: List[str]) -> int:
    topology, placement = _plan("/", args, plan_only=True)
    engine_notes = _check_engine(placement, server_argv, args.best_effort, args.container_runtime)
    # Placement first: a page the scan faults in is then read under the plan's policy.
    notes, bound = _apply_unless_baseline(placement, topology, args.best_effort)
    notes += engine_notes
    argv, kept = _server_command(server_argv, placement, args.container_runtime, bound)
    if kept:
        notes.append("engine %s: the command's own %s kept" % (placement.engine["engine"], " ".join(kept)))
    models = args.model
    action = _page_cache_action(args.page_cache, placement.policy)
    if models and action == "replicate":
        action = "evict"  # of the copies; of the shared files if they cannot be made
        try:
            models, argv, replicated = _replicate(models, argv, placement, args.replica_dir,
                                                  bool(args.container_runtime))
            notes.extend(replicated)
        except NumaError as exc:
            notes.append("page cache: NOT replicated, the server maps the shared model: %s" % exc)
    if models:
        notes.extend(_settle_page_cache(models, placement, action))
    os.environ.update(placement.env)
    _say("%s%s; exec %s" % (placement.summary(), "".join("; " + note for note in notes), argv[0]))
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        _say("cannot exec %r: %s. Fix: give the server's absolute path, or install it" % (argv[0], exc.strerror))
        return EXIT_NOT_FOUND
    return 0  # not reached: execvp replaced this process


def run_audit(args: argparse.Namespace, _server_argv: List[str]) -> int:
    from ..act.device_irqs import audit_interrupts
    from ..read.audit import audit_service, load_plan

    plan = load_plan(args.plan_file) if args.plan_file else None
    report = audit_interrupts(audit_service(args.pid, args.unit, plan, args.min_local_percent, args.pages,
                                            wait_seconds=args.wait_seconds), "/", plan)
    _print_json(report)
    return 0 if report.get("ok") else EXIT_AUDIT_FAILED


def run_cost(args: argparse.Namespace, _server_argv: List[str]) -> int:
    from .cost_command import run

    return run(args, sys.stdout)


def run_metrics(args: argparse.Namespace, _server_argv: List[str]) -> int:
    from .metrics_command import run

    return run(args, sys.stdout)


def run_irqs(args: argparse.Namespace, _server_argv: List[str]) -> int:
    """One line per interrupt set, those the kernel manages named; a table that cannot be trusted exits 2, an
    affinity the kernel refused 3, each with one line."""
    from ..act.device_irqs import apply_table, read_table

    table = read_table(args.root)
    try:
        done, managed = apply_table(args.root, table)
    except NumaError as exc:
        exc.exit_code = EXIT_KERNEL_REFUSED  # type: ignore[attr-defined]
        raise
    sys.stdout.write("".join(line + "\n" for line in done))
    sys.stdout.write("".join("%s: managed by the kernel, left as it is\n" % name for name in managed))
    return 0


# --- applying a plan ------------------------------------------------------


def _check_engine(placement: Plan, server_argv: List[str], best_effort: bool,
                  container: Optional[str] = None) -> List[str]:
    """Refuse a command with flags that would undo the binding, and (or, best-effort, drop) an
    engine recipe whose programs this host lacks: the engine would fail at its first worker, far
    from the cause. A container's programs are its image's, which only the engine's start can look at."""
    from ..base.engines import conflicting_flags, missing_programs

    engine = placement.engine["engine"]
    # What the server starts with: numa-pin's environment (the unit's Environment= among it) and the plan's.
    conflicts = conflicting_flags(engine, server_argv, dict(os.environ, **placement.env))
    if conflicts and not best_effort:
        raise NumaError("refusing engine %s's %s: remove it from the command (numa-pin binds the process), or set "
                        "engine generic to start the command as given" % (engine, "; ".join(conflicts)))
    notes = ["best-effort: engine %s's %s kept" % (engine, "; ".join(conflicts))] if conflicts else []
    missing = missing_programs(placement.engine["requires"], os.environ.get("PATH", os.defpath))
    if not missing or container:
        return notes
    problem = ("engine %s binds each worker with %s, which is not on PATH (%s)" % (
        placement.engine["engine"], " and ".join(missing), os.environ.get("PATH", os.defpath)))
    if not best_effort:
        raise NumaError("%s: install it (the inference_service role does with inference_service_install_engine_tools: "
                        "true), or set engine generic to leave the workers unbound" % problem)
    placement.engine["args"] = []
    return notes + ["best-effort: %s; its arguments NOT added" % problem]


def _server_command(server_argv: List[str], placement: Plan, container: Optional[str],
                    bound: bool) -> Tuple[List[str], List[str]]:
    from ..base.tokens import server_command

    return server_command(server_argv, placement.to_dict(), container, bound)


def _apply_unless_baseline(placement: Plan, topology: Dict[str, Any], best_effort: bool) -> Tuple[List[str], bool]:
    """(notes, whether the plan binds): _apply, except for the A/B gate's unbound baseline (its runtime drop-in sets
    BASELINE_ENV=unbound for one start, then is removed): the plan's threads and port, at the Linux default affinity
    and memory policy (a container without the plan's cpuset)."""
    from ..base.tokens import BASELINE_ENV

    if os.environ.pop(BASELINE_ENV, None) != "unbound":
        return _apply(placement, topology, best_effort), True
    return ["A/B gate baseline: affinity and memory policy NOT set (the Linux default), for one measurement"], False


def _apply(placement: Plan, topology: Dict[str, Any], best_effort: bool) -> List[str]:
    """Set CPU affinity then memory policy; return notes on any degradation."""
    from ..system import kernel
    from ..base.cpulist import parse_cpulist

    allowed_cpus = parse_cpulist(topology["cpus"]["allowed"]) or None
    allowed_mems = parse_cpulist(topology["cpus"]["mems_allowed"]) or None
    notes = []
    try:
        kernel.set_cpu_affinity(placement.cpus, allowed_cpus)
    except NumaError as exc:
        if not best_effort:
            raise _refused(exc)
        notes.append("best-effort: CPU affinity NOT set (%s)" % exc)
    for policy, nodes in _policy_fallbacks(placement, best_effort):
        try:
            kernel.set_mempolicy(policy, nodes, allowed_mems)
            if policy != placement.policy:
                notes.append("best-effort: memory policy degraded to %s on node(s) %s"
                             % (policy, ",".join(str(n) for n in nodes)))
            return notes
        except NumaError as exc:
            if not best_effort:
                raise _refused(exc)
            notes.append("best-effort: %s refused (%s)" % (policy, exc))
    notes.append("best-effort: memory policy NOT set; memory follows the kernel default (first touch)")
    return notes


def _policy_fallbacks(placement: Plan, best_effort: bool) -> List[Tuple[str, List[int]]]:
    steps = [(placement.policy, placement.mem_nodes)]
    if best_effort and placement.policy != "preferred":
        steps.append(("preferred", [placement.node]))
    return steps


def _refused(exc: NumaError) -> NumaError:
    error = NumaError("refusing to start the server unpinned: %s. (--best-effort would degrade instead)" % exc)
    error.exit_code = EXIT_KERNEL_REFUSED
    return error


def _page_cache_action(choice: Optional[str], policy: str) -> str:
    if choice:
        return choice
    return "evict" if policy == "bind" else "warn"


def _replicate(models: List[str], argv: List[str], placement: Plan, replica_dir: Optional[str],
               mounted: bool) -> Tuple[List[str], List[str], List[str]]:
    """(the copies, the server argv naming them (a container's volumes, when ``mounted``), notes): one copy of each
    model per node set."""
    from ..act.replica import ensure_replica, point_at_replicas, replica_root

    root = replica_root(replica_dir)
    replicas = {}
    notes = []
    for source in models:
        copy, copied = ensure_replica(source, root, placement.mem_nodes)
        replicas[source] = copy
        notes.append("page cache: %s %s" % ("copied the model to" if copied else "the model's copy is", copy))
    return list(replicas.values()), point_at_replicas(argv, replicas, mounted), notes


def _replica_paths(models: List[str], placement: Plan, replica_dir: Optional[str]) -> Dict[str, Any]:
    from ..act.replica import replica_path, replica_root

    try:
        root = replica_root(replica_dir)
    except NumaError as exc:
        return {"error": str(exc)}
    return {source: replica_path(root, source, placement.mem_nodes) for source in models}


def _settle_page_cache(models: List[str], placement: Plan, action: str) -> List[str]:
    """Report, and with ``evict`` drop, model pages cached on nodes outside the plan."""
    if action == "ignore":
        return []
    from ..act.pagecache import regular_files

    notes = []
    local = set(placement.mem_nodes)
    for path in regular_files(models):
        try:
            notes.extend(_settle_file(path, local, action))
        except NumaError as exc:
            # The placement itself is applied; only the look at the page cache failed.
            notes.append("page cache NOT checked: %s" % exc)
    return notes


def _settle_file(path: str, local: Set[int], action: str) -> List[str]:
    from ..act.pagecache import evict_remote, sample_residency

    # A sample, not every page: this runs at every start, and a full look costs ~0.3-0.9 us
    # per cached page (seconds for a cached 40 GiB model).
    look = sample_residency(path, local_nodes=local)
    nodes = look["nodes"]
    remote = sum(count for node, count in nodes.items() if int(node) not in local)
    if not remote:
        return []
    if action == "evict":
        # Only once the sample saw remote pages (a remote share under ~1 % may go unseen and
        # stay: under 1 % of the weights read across the link). evict_remote then looks at
        # every page: each remote page it skipped would stay remote.
        outcome = evict_remote(path, local)
        notes = []
        if outcome["evicted_pages"]:
            notes.append("page cache: dropped %d pages of %s cached on remote nodes" % (outcome["evicted_pages"], path))
        if outcome["skipped_reason"]:
            notes.append("page cache: NOT evicted: %s" % outcome["skipped_reason"])
        return notes
    return ["page cache: %d pages of %s sit on remote nodes (%s; %s)" % (
        remote, path, ", ".join("N%s=%d" % item for item in sorted(nodes.items())), look["estimate"])]


# --- output ---------------------------------------------------------------


def _print_json(data: Any) -> None:
    """Print ``data`` as ``json.dumps(data, indent=2, sort_keys=True)`` does, byte for byte."""
    sys.stdout.write(_json_text(data, "\n") + "\n")


def _json_text(value: Any, newline: str) -> str:
    """``value``'s indented JSON; ``newline`` is a line break and the indent of the value's level.

    json's indenting encoder is pure Python, and was half of ``numa-pin facts`` on a 256-CPU
    machine. The types the commands print (str-keyed dict, list, str, int, bool, None) are
    written here; anything else (a float, an int key) is json's own output for that value,
    indented to its level (JSON strings hold no raw line breaks).
    """
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is str:
        return _json_string(value)
    if value is None or kind is bool:
        return "null" if value is None else "true" if value else "false"
    if (kind is list or kind is dict) and not value:
        return "[]" if kind is list else "{}"
    inner = newline + "  "
    if kind is list:
        if set(map(type, value)) == _INT:
            items = list(map(str, value))
        else:
            items = [_json_text(item, inner) for item in value]
        return "[" + inner + ("," + inner).join(items) + newline + "]"
    if kind is dict and set(map(type, value)) == _STR:
        if set(map(type, value.values())) == _INT:
            return _int_dict_text(value, newline)
        items = [_json_string(key) + ": " + _json_text(value[key], inner) for key in sorted(value)]
        return "{" + inner + ("," + inner).join(items) + newline + "}"
    return _json_dumps(value).replace("\n", newline)


# Exactly these types, not a subclass (a bool is an int): map(type, ...) runs in C.
_INT = {int}
_STR = {str}
# (keys in order, %-template) per (keys, indent) of a dict of ints: a large machine's facts hold one
# such dict per node, its distances to every node, all with the same keys.
_INT_DICTS = {}  # type: Dict[Tuple[Tuple[str, ...], str], Tuple[List[str], str]]


def _int_dict_text(value: Dict[str, int], newline: str) -> str:
    shape = (tuple(value), newline)
    if shape not in _INT_DICTS:
        keys = sorted(value)
        inner = newline + "  "
        lines = [_json_string(key).replace("%", "%%") + ": %d" for key in keys]
        _INT_DICTS[shape] = keys, "{" + inner + ("," + inner).join(lines) + newline + "}"
    keys, template = _INT_DICTS[shape]
    return template % tuple(map(value.__getitem__, keys))


def _json_string(text: str) -> str:
    return '"' + text + '"' if _plain(text) else _json_dumps(text)


def _plain(text: str) -> bool:
    """Nothing in ``text`` that json escapes: printable ASCII without quotes or backslashes."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


def _json_dumps(value: Any) -> str:
    import json

    return json.dumps(value, indent=2, sort_keys=True)


def _say(message: str) -> None:
    sys.stderr.write("numa-pin: %s\n" % message)
    sys.stderr.flush()
