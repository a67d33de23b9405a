"""Measure what crossing NUMA nodes costs on this host: latency and bandwidth per node pair.

For every (CPU node i, memory node j) a forked child pins itself to node i's CPUs,
binds its memory to node j (``MPOL_BIND``), allocates the buffers there, checks
with move_pages(2) that their pages really landed on j, and measures:

latency
    A dependent-load pointer chase (``i = slots[i]``) over a random cyclic
    permutation of 64-byte lines in a buffer several times larger than the last
    level cache, so nearly every step is a cache (and TLB) miss. The Python
    interpreter adds a fixed cost per step; the same loop over a buffer that fits
    in L1 measures that cost, and the difference is the memory latency. What the
    subtraction also removes is one L1 hit per step (~1 ns), so the result is low
    by about that much; a unit test against a C chase of the same buffer keeps
    the method honest (docs/cost.md has the figures). Each chase is timed in
    stretches of CHUNK_STEPS and the fastest stretch counts: preemption and other
    processes' memory traffic only ever make a stretch slower.
bandwidth
    Sequential copies between the two halves of the bound buffer with memoryview
    slice assignment (libc memmove, C speed). GB/s counts bytes read plus bytes
    written (the STREAM "copy" convention), 1 GB = 1e9 bytes; best of ``repeats``.

Pairs run one at a time, round-robin, ``rounds`` times; each pair keeps its quietest
round, so contention that comes and goes hits all pairs alike.

Results come back as matrices in ``nodes`` order, next to
their ratio to the local (nearest-memory) column and the SLIT distance ratio.
Every pair that is not measured carries a reason instead of a number.
"""
import array
import json
import math
import mmap
import os
import platform
import random
import select
import signal
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..read import audit, numastat, topology
from ..decide.weights import topology_signature
from ..system import kernel, safe_fs, trusted_files
from ..base.cpulist import parse_cpulist
from ..base.errors import NumaError, shown
from ..base.sizes import format_size

LINE_BYTES = 64
SLOTS_PER_LINE = LINE_BYTES // 8  # "Q" slots: one chase slot per cache line
PAGE_BYTES = mmap.PAGESIZE
MIB = 1024 * 1024

# The chase buffer is this many times the largest cache, and never smaller than
# MIN_BUFFER_BYTES: caches with adaptive replacement still hold part of a buffer
# only twice their size.
LLC_MULTIPLE = 4
MIN_BUFFER_BYTES = 64 * MIB
# Used when sysfs does not tell the cache sizes (containers, some VMs).
FALLBACK_CACHES_KB = {"l1d_kb": 32, "l2_kb": 1024, "l3_kb": 32768}
# Beyond the buffers, the child's own heap lands on the bound node too.
CHILD_SLACK_BYTES = 32 * MIB
PAGES_SAMPLED = 64

DEFAULT_CHASE_STEPS = 1000000
# Every pair is measured this many times, in round-robin order, and its quietest round
# (lowest raw chase time) counts: a stretch of contention then hits one round of a
# pair, not the pair, and spreads over all pairs alike.
DEFAULT_ROUNDS = 2
# Long enough that timer reads cost nothing (~0.1 %) and per-step variation averages
# out; short enough (about 1 ms) that most stretches escape other processes' bursts.
CHUNK_STEPS = 5000
DEFAULT_REPEATS = 5
DEFAULT_MAX_SECONDS = 120.0
# A child that finished its work gets this long to exit before it is killed.
EXIT_GRACE_SECONDS = 2.0
# The largest value each option takes: far past any useful measurement, and small enough that no
# loop or allocation scales with a hostile number (rounds x pairs is a loop; the buffers are memory).
MAX_OPTIONS = {"buffer_mb": 1 << 20, "small_kb": 1 << 20, "chase_steps": 10 ** 9, "repeats": 1000,
               "rounds": 1000, "max_seconds": 86400, "window_seconds": 3600}
PR_SET_PDEATHSIG = 1

Pair = Tuple[int, int]
# plan_pairs(): node order, pairs to measure, pair -> reason it cannot be, CPU node -> CPUs.
PairPlan = Tuple[List[int], List[Pair], Dict[Pair, str], Dict[int, List[int]]]
Measurement = Dict[str, Any]
# Runs one measurement in isolation: (work, timeout seconds) -> payload, or None on timeout.
MeasurementRunner = Callable[[Callable[[], Measurement], float], Optional[Measurement]]
# Hears a line of what the measurement does next.
Progress = Optional[Callable[[str], None]]


class CostOptions:
    """What to measure and how long it may take; validated on construction."""

    def __init__(self, buffer_mb: Optional[int] = None, small_kb: Optional[int] = None,
                 chase_steps: int = DEFAULT_CHASE_STEPS, repeats: int = DEFAULT_REPEATS,
                 max_seconds: float = DEFAULT_MAX_SECONDS, rounds: int = DEFAULT_ROUNDS) -> None:
        if buffer_mb is not None:
            _require_count("buffer_mb", buffer_mb, "64 or leave it unset")
        if small_kb is not None:
            _require_count("small_kb", small_kb, "16 or leave it unset")
        _require_count("chase_steps", chase_steps, str(DEFAULT_CHASE_STEPS))
        _require_count("repeats", repeats, str(DEFAULT_REPEATS))
        check_seconds("max_seconds", max_seconds, str(int(DEFAULT_MAX_SECONDS)))
        _require_count("rounds", rounds, str(DEFAULT_ROUNDS))
        self.buffer_mb = buffer_mb
        self.small_kb = small_kb
        self.chase_steps = chase_steps
        self.repeats = repeats
        self.max_seconds = float(max_seconds)
        self.rounds = rounds


def _require_count(name: str, value: Any, example: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_OPTIONS[name]:
        raise NumaError("cost option %s=%s is not a whole number from 1 to %d: give one like %s"
                        % (name, shown(value), MAX_OPTIONS[name], example))


def check_seconds(name: str, value: Any, example: str) -> None:
    """A positive, finite duration up to the option's bound: NaN or infinity would never time out."""
    finite = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    if isinstance(value, bool) or not finite or not 0 < value <= MAX_OPTIONS[name]:
        raise NumaError("cost option %s=%s is not a number of seconds above 0 and at most %d: give one like %s"
                        % (name, shown(value), MAX_OPTIONS[name], example))


# --- sizes -----------------------------------------------------------------------------

def buffer_sizes(caches: Dict[str, Optional[int]], options: CostOptions) -> Tuple[int, int, List[str]]:
    """(chase buffer bytes, L1-resident buffer bytes, notes on where they came from)."""
    notes = []
    known = {key: value for key, value in (caches or {}).items() if value}
    for key, fallback in sorted(FALLBACK_CACHES_KB.items()):
        if key not in known:
            notes.append("cache size %s unknown in sysfs: assumed %d KiB" % (key, fallback))
    sizes = dict(FALLBACK_CACHES_KB, **known)
    llc_bytes = max(sizes["l3_kb"], sizes["l2_kb"]) * 1024
    if options.buffer_mb:
        big = options.buffer_mb * MIB
        if big < 2 * llc_bytes:
            notes.append("buffer_mb=%d is less than twice the last-level cache (%s): part of the "
                         "chase hits the cache and latency reads low" % (options.buffer_mb, format_size(llc_bytes)))
    else:
        big = max(LLC_MULTIPLE * llc_bytes, MIN_BUFFER_BYTES)
    # Half of L1d leaves the other half to the interpreter's own working set.
    small = options.small_kb * 1024 if options.small_kb else sizes["l1d_kb"] * 1024 // 2
    return _round_up(big, PAGE_BYTES), _round_up(max(small, LINE_BYTES * 2), LINE_BYTES), notes


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def needed_bytes(big: int, small: int) -> int:
    """Free memory a memory node must have before a child may bind to it."""
    return big + small + CHILD_SLACK_BYTES


# --- which pairs can be measured ---------------------------------------------------------

def plan_pairs(topology: Dict[str, Any], need: int) -> PairPlan:
    """(node order, pairs to measure with the local ones first, pair -> reason it cannot be,
    CPU node -> CPUs to pin to)."""
    nodes = [node["id"] for node in topology.get("nodes", [])]
    cpus_info = topology.get("cpus", {})
    allowed_cpus = _allowed(cpus_info.get("allowed"))
    allowed_mems = _allowed(cpus_info.get("mems_allowed"))
    row_reasons = {}  # type: Dict[int, str]
    col_reasons = {}  # type: Dict[int, str]
    pin = {}  # type: Dict[int, List[int]]
    for node in topology.get("nodes", []):
        row_reasons[node["id"]], pin[node["id"]] = _cpu_side(node, allowed_cpus, cpus_info.get("allowed"))
        col_reasons[node["id"]] = _memory_side(node, allowed_mems, cpus_info.get("mems_allowed"), need)
    pairs = []
    unmeasured = {}
    for i in nodes:
        for j in nodes:
            reasons = [text for text in (row_reasons[i], col_reasons[j]) if text]
            if reasons:
                unmeasured[(i, j)] = "; ".join(reasons)
            else:
                pairs.append((i, j))
    pairs.sort(key=lambda pair: (pair[0] != pair[1], pair))
    return nodes, pairs, unmeasured, {i: cpus for i, cpus in pin.items() if cpus}


def _allowed(text: Optional[str]) -> Optional[List[int]]:
    # The facts contract: "" means unknown, to be treated as everything (None).
    return parse_cpulist(text) if text else None


def _cpu_side(node: Dict[str, Any], allowed: Optional[List[int]], allowed_text: Optional[str]) -> Tuple[str, List[int]]:
    if not node.get("has_cpus") or not node.get("cpus"):
        return "node %d has no CPUs (memory-only node): nothing can run there" % node["id"], []
    cpus = [cpu for cpu in node["cpus"] if allowed is None or cpu in allowed]
    if not cpus:
        return ("this process's cpuset does not allow node %d's CPUs %s (Cpus_allowed_list %s): run the "
                "measurement outside that cgroup, or widen its cpuset.cpus"
                % (node["id"], node.get("cpulist", ""), allowed_text)), []
    return "", cpus


def _memory_side(node: Dict[str, Any], allowed: Optional[List[int]], allowed_text: Optional[str], need: int) -> str:
    if not node.get("has_memory"):
        return "node %d has no memory (memory-less node): nothing can be allocated there" % node["id"]
    if allowed is not None and node["id"] not in allowed:
        return ("this process's cpuset does not allow memory on node %d (Mems_allowed_list %s): run the "
                "measurement outside that cgroup, or widen its cpuset.mems" % (node["id"], allowed_text))
    free = (node.get("memory_free_kb") or 0) * 1024
    if free < need:
        return ("node %d has %s free but the measurement needs %s there: free memory on node %d, or "
                "pass a smaller buffer_mb (numbers below twice the last-level cache read low)"
                % (node["id"], format_size(free), format_size(need), node["id"]))
    return ""


# --- the chase and the copy (run in the pinned, bound child) -----------------------------

def cyclic_permutation(lines: int, rng: random.Random) -> "array.array[int]":
    """Slot index of the next line for every line: one cycle through all ``lines``.

    Sattolo's algorithm: swapping only with earlier positions turns the shuffle
    into a single cycle, so a chase from anywhere visits every line once.
    """
    order = list(range(0, lines * SLOTS_PER_LINE, SLOTS_PER_LINE))
    draw = rng.random
    for top in range(lines - 1, 0, -1):
        other = int(draw() * top)
        order[top], order[other] = order[other], order[top]
    return array.array("Q", order)


def chase_chunks(slots: memoryview, steps: int, chunk: int = CHUNK_STEPS) -> List[float]:
    """Seconds per step of each ``chunk``-step stretch of one continuous chase.

    Short timed stretches let the caller keep the fastest: a preemption or a burst of
    memory traffic from another process spoils one stretch, not the whole figure.
    """
    index = 0
    per_step = []
    for dummy in range(max(steps // chunk, 1)):
        begin = time.perf_counter()
        for dummy in range(chunk):
            index = slots[index]
        per_step.append((time.perf_counter() - begin) / chunk)
    return per_step


def net_latency_ns(big_step_seconds: float, small_step_seconds: float) -> float:
    """Memory latency: the chase over the big buffer minus the interpreter's per-step cost
    measured by the same loop over the L1-resident buffer."""
    return (big_step_seconds - small_step_seconds) * 1e9


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def copy_gbps(data: memoryview, repeats: int) -> float:
    """Best copy rate between the buffer's two halves: (bytes read + bytes written) / s / 1e9."""
    half = len(data) // 2
    best = float("inf")
    for run in range(repeats):
        low, high = data[:half], data[half:2 * half]
        begin = time.perf_counter()
        if run % 2:
            low[:] = high
        else:
            high[:] = low
        best = min(best, time.perf_counter() - begin)
    return 2 * half / best / 1e9


def filled_buffer(size: int, nexts: "array.array[int]") -> Tuple[mmap.mmap, memoryview]:
    """An anonymous mapping holding the chase permutation; writing it places every page
    under the calling thread's memory policy."""
    buffer = mmap.mmap(-1, size)
    slots = memoryview(buffer).cast("Q")
    slots[0:len(nexts) * SLOTS_PER_LINE:SLOTS_PER_LINE] = nexts
    return buffer, slots


def page_addresses(buffer: mmap.mmap, count: int) -> List[int]:
    """Addresses of ``count`` pages spread evenly over ``buffer``."""
    import ctypes

    anchor = ctypes.c_char.from_buffer(buffer)
    base = ctypes.addressof(anchor)
    del anchor  # an exported buffer would keep the mapping from ever closing
    pages = len(buffer) // PAGE_BYTES
    step = max(pages // count, 1)
    return [base + page * PAGE_BYTES for page in range(0, pages, step)][:count]


def placement_check(nodes_found: Sequence[int], node: int) -> Tuple[bool, str]:
    """(all pages on ``node``?, a sentence saying where the sampled pages are)."""
    on_node = sum(1 for found in nodes_found if found == node)
    if on_node == len(nodes_found):
        return True, "%d of %d sampled pages on node %d" % (on_node, len(nodes_found), node)
    elsewhere = {}  # type: Dict[str, int]
    for found in nodes_found:
        if found != node:
            key = "node %d" % found if found >= 0 else "errno %d" % -found
            elsewhere[key] = elsewhere.get(key, 0) + 1
    return False, ("only %d of %d sampled pages on node %d (others: %s)"
                   % (on_node, len(nodes_found), node,
                      ", ".join("%s x%d" % item for item in sorted(elsewhere.items()))))


class PairWork:
    """The measurement of one pair, as run inside the forked child."""

    def __init__(self, cpus: List[int], node: int, big: int, small: int, nexts_big: "array.array[int]",
                 nexts_small: "array.array[int]", options: CostOptions, kernel_api: Any) -> None:
        self.cpus = cpus
        self.node = node
        self.big = big
        self.small = small
        self.nexts_big = nexts_big
        self.nexts_small = nexts_small
        self.options = options
        self.kernel = kernel_api

    def __call__(self) -> Measurement:
        # Pin and bind before the first allocation so that every page, the
        # interpreter's new ones included, follows the policy.
        self.kernel.set_cpu_affinity(self.cpus)
        self.kernel.set_mempolicy("bind", [self.node])
        big_buffer, big_slots = filled_buffer(self.big, self.nexts_big)
        small_buffer, small_slots = filled_buffer(self.small, self.nexts_small)
        placed = self.kernel.query_page_nodes(page_addresses(big_buffer, PAGES_SAMPLED)
                                              + page_addresses(small_buffer, 1))
        on_node, placement = placement_check(placed, self.node)
        if not on_node:
            return {"error": "the kernel did not place the buffer on node %d under MPOL_BIND: %s; "
                             "check /proc/self/numa_maps and the cpuset's mems" % (self.node, placement)}
        overhead = min(chase_chunks(small_slots, self.options.chase_steps))
        raw = chase_chunks(big_slots, self.options.chase_steps)
        latency = net_latency_ns(min(raw), overhead)
        if latency <= 0:
            return {"error": "the chase over %s took no longer than over %s (%.1f vs %.1f ns per step): the "
                             "big buffer stays in a cache; pass a larger buffer_mb"
                             % (format_size(self.big), format_size(self.small), min(raw) * 1e9, overhead * 1e9)}
        gbps = copy_gbps(memoryview(big_buffer), self.options.repeats)
        return {"latency_ns": latency, "raw_ns": min(raw) * 1e9, "overhead_ns": overhead * 1e9,
                "spread": median(raw) / min(raw), "bandwidth_gbps": gbps, "placement": placement}


# --- running a child safely ------------------------------------------------------------

def run_forked(work: Callable[[], Measurement], timeout: float) -> Optional[Measurement]:
    """Run ``work`` in a forked child; its dict, or None when it outlived ``timeout``.

    The child always ends with ``os._exit`` (no cleanup handlers of the parent run
    twice) and dies with the parent; the parent kills it at the deadline and reaps it
    in every case, so no process is ever left behind.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            _die_with_parent()
            _write_all(write_fd, json.dumps(_child_payload(work)).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    data = None
    try:
        data = _read_until(read_fd, time.monotonic() + timeout)
    finally:
        os.close(read_fd)
        # A child that reported is exiting: give it a moment. Otherwise kill it now.
        _reap(pid, EXIT_GRACE_SECONDS if data is not None else 0.0)
    if data is None:
        return None
    try:
        return json.loads(data.decode())
    except ValueError:
        return {"error": "the measuring child died before reporting (killed by the OOM killer or a "
                         "signal?); check dmesg and the node's free memory"}


def _child_payload(work: Callable[[], Measurement]) -> Measurement:
    try:
        return work()
    except NumaError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # the child must report, never raise past _exit
        return {"error": "measurement failed: %s: %s" % (type(exc).__name__, exc)}


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this child if the parent dies (prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the chase is bounded by chase_steps anyway; this only shortens an orphan's life


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_until(fd: int, deadline: float) -> Optional[bytes]:
    chunks = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _reap(pid: int, grace: float) -> None:
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


# --- assembling the answer ---------------------------------------------------------------

def reference_columns(nodes: List[int], distances: List[List[Any]], has_memory: Dict[int, bool]) -> List[Optional[int]]:
    """Per row, the column index that counts as "local": the memory node nearest by SLIT
    (the node itself when it has memory; ties go to the lower id)."""
    refs = []  # type: List[Optional[int]]
    for row, node in enumerate(nodes):
        if has_memory.get(node):
            refs.append(row)
            continue
        candidates = [(_cell(distances, row, col), col) for col in range(len(nodes))
                      if has_memory.get(nodes[col]) and _cell(distances, row, col) is not None]
        refs.append(min(candidates)[1] if candidates else None)
    return refs


def _cell(matrix: List[List[Any]], row: int, col: int) -> Any:
    try:
        return matrix[row][col]
    except (IndexError, TypeError):
        return None


def ratio_matrix(values: List[List[Optional[float]]], refs: List[Optional[int]]) -> List[List[Optional[float]]]:
    """Each value over its row's local reference; None where either is missing."""
    result = []
    for row, cells in enumerate(values):
        ref = refs[row]
        base = cells[ref] if ref is not None else None
        result.append([round(cell / base, 3) if cell is not None and base else None for cell in cells])
    return result


def value_matrix(nodes: List[int], results: Dict[Pair, Measurement], key: str, digits: int) -> List[List[Optional[float]]]:
    return [[_rounded(results.get((i, j), {}).get(key), digits) for j in nodes] for i in nodes]


def _rounded(value: Optional[float], digits: int) -> Optional[float]:
    return None if value is None else round(value, digits)


def pair_key(pair: Pair) -> str:
    """How a (CPU node, memory node) pair is named in the result: ``"0->1"``."""
    return "%d->%d" % pair


def assemble(topology: Dict[str, Any], nodes: List[int], results: Dict[Pair, Measurement],
             unmeasured: Dict[Pair, str]) -> Dict[str, Any]:
    """Matrices in ``nodes`` order (row = CPU node, column = memory node), with ratios."""
    distances = topology.get("distances") or []
    has_memory = {node["id"]: bool(node.get("has_memory")) for node in topology.get("nodes", [])}
    refs = reference_columns(nodes, distances, has_memory)
    latency = value_matrix(nodes, results, "latency_ns", 1)
    bandwidth = value_matrix(nodes, results, "bandwidth_gbps", 2)
    distance = [[_cell(distances, row, col) for col in range(len(nodes))] for row in range(len(nodes))]
    notes = []
    for row, ref in enumerate(refs):
        measured_row = any(cell is not None for cell in latency[row])
        if measured_row and (ref is None or latency[row][ref] is None):
            notes.append("CPU node %d: its local pair was not measured, so its row has no ratios"
                         % nodes[row])
    return {
        "nodes": nodes,
        "latency_ns": latency,
        "bandwidth_gbps": bandwidth,
        "latency_ratio": ratio_matrix(latency, refs),
        "bandwidth_ratio": ratio_matrix(bandwidth, refs),
        "distance": distance,
        "distance_ratio": ratio_matrix(distance, [row if ref is None else ref for row, ref in enumerate(refs)]),
        "local_reference": [None if ref is None else nodes[ref] for ref in refs],
        "unmeasured": {pair_key(pair): reason for pair, reason in sorted(unmeasured.items())},
        "placement": {pair_key(pair): result["placement"] for pair, result in sorted(results.items())
                      if "placement" in result},
        "notes": notes,
    }


def method_text(big: int, small: int, options: CostOptions, results: Dict[Pair, Measurement],
                nodes: List[int], size_notes: List[str], thp: Optional[str] = None) -> Dict[str, Any]:
    """How the numbers were made, and how far to trust them."""
    return {
        "measured": ("latency_ns, bandwidth_gbps and their ratios are measured on this host now; "
                     "distance and distance_ratio are the firmware's SLIT table, not a measurement"),
        "latency": ("Python pointer chase over a random cyclic permutation of %d-byte lines in a %s buffer, "
                    "minus the same chase over a %s buffer (the interpreter's cost per step); fastest "
                    "%d-step stretch of %d steps each, quietest of %d round(s) per pair"
                    % (LINE_BYTES, format_size(big), format_size(small), CHUNK_STEPS, options.chase_steps,
                       options.rounds)),
        "latency_error": ("reads low: latency_ns is raw_ns minus the interpreter's cost per step (overhead_ns), "
                          "and that subtraction also removes one L1 hit per step and the part of the "
                          "interpreter's work the CPU overlaps with the miss; a C chase of the same buffer has "
                          "neither error (tests/integration/test_cost_c_reference.py compares the two); %s; remote/local "
                          "ratios lie between the raw_ns ratio and the latency_ns ratio; %s"
                          % (_subtracted(results), _page_note(thp))),
        "bandwidth": ("memmove between the halves of the bound %s buffer; GB/s = (bytes read + bytes written) / "
                      "seconds / 1e9 (STREAM copy convention); best of %d copies per round"
                      % (format_size(big), options.repeats)),
        "ratios": ("each row divided by its local column: the CPU node's own memory, or the nearest memory "
                   "node by SLIT for a memory-less CPU node (local_reference); latency ratio > 1 and bandwidth "
                   "ratio < 1 mean remote is worse"),
        "noise": ("fastest stretch / best copy: other processes make numbers read high, not low; load average "
                  "at the start was %s; spread = median stretch / fastest stretch of the big chase (1.0 = "
                  "quiet host)" % _loadavg()),
        "buffer_bytes": big,
        "small_buffer_bytes": small,
        "chase_steps": options.chase_steps,
        "chunk_steps": CHUNK_STEPS,
        "repeats": options.repeats,
        "rounds": options.rounds,
        "rounds_done": value_matrix(nodes, results, "rounds", 0),
        "raw_ns": value_matrix(nodes, results, "raw_ns", 1),
        "overhead_ns": value_matrix(nodes, results, "overhead_ns", 1),
        "spread": value_matrix(nodes, results, "spread", 2),
        "pair_seconds": value_matrix(nodes, results, "seconds", 2),
        "python": platform.python_version(),
        "notes": size_notes,
    }


def _subtracted(results: Dict[Pair, Measurement]) -> str:
    """What the subtraction took off in this run, over the measured pairs."""
    if not results:
        return "no pair was measured in this run, so nothing was subtracted"
    overhead = [result["overhead_ns"] for result in results.values()]
    share = [100 * result["overhead_ns"] / result["raw_ns"] for result in results.values()]
    return "in this run overhead_ns was %s ns, %s %% of raw_ns" % (_span(overhead, 1), _span(share, 0))


def _span(values: List[float], digits: int) -> str:
    """``"20.1"`` or ``"20.1-23.4"``: the range of ``values`` at ``digits`` decimals."""
    low, high = ("%.*f" % (digits, value) for value in (min(values), max(values)))
    return low if low == high else "%s-%s" % (low, high)


def _page_note(thp: Optional[str]) -> str:
    if thp == "always":
        return ("transparent hugepages are 'always' here: the kernel may back the buffer with 2 MiB pages, "
                "so fewer TLB misses are included than an application with 4 KiB pages sees")
    return "TLB misses of 4 KiB pages are included, as an application without huge pages sees them"


def _loadavg() -> str:
    try:
        return "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "unknown"


# --- the whole run -----------------------------------------------------------------------

def measure(topology: Dict[str, Any], options: Optional[CostOptions] = None, kernel_api: Any = kernel,
            runner: MeasurementRunner = run_forked, clock: Callable[[], float] = time.monotonic,
            rng: Optional[random.Random] = None, progress: Progress = None) -> Dict[str, Any]:
    """Measure every measurable (CPU node, memory node) pair of ``topology`` within
    ``options.max_seconds``; see the module doc for the method and the result's shape.
    ``progress`` hears what is being done, before each step (numa-pin cost prints it)."""
    options = options or CostOptions()
    say = progress or _quiet
    started = clock()
    big, small, size_notes = buffer_sizes(topology.get("cpus", {}).get("caches", {}), options)
    nodes, pairs, unmeasured, pin = plan_pairs(topology, needed_bytes(big, small))
    results = {}  # type: Dict[Pair, Measurement]
    setup = 0.0
    if pairs:
        say("%d pair(s) x %d round(s) within max_seconds=%g; building the chase's random order over %s"
            % (len(pairs), options.rounds, options.max_seconds, format_size(big)))
        # One permutation for all pairs: built once here, inherited by every forked child.
        rng = rng or random.Random()
        nexts_big = cyclic_permutation(big // LINE_BYTES, rng)
        nexts_small = cyclic_permutation(small // LINE_BYTES, rng)
        setup = clock() - started
        works = [(pair, PairWork(pin[pair[0]], pair[1], big, small, nexts_big, nexts_small, options, kernel_api))
                 for pair in pairs]
        _run_pairs(works, runner, options.rounds, options.max_seconds - (clock() - started), clock, results,
                   unmeasured, say)
    answer = assemble(topology, nodes, results, unmeasured)
    thp = (topology.get("kernel") or {}).get("transparent_hugepage")
    answer["method"] = method_text(big, small, options, results, nodes, size_notes, thp)
    answer["method"]["setup_seconds"] = round(setup, 2)
    answer["elapsed_seconds"] = round(clock() - started, 2)
    return answer


def _run_pairs(works: List[Tuple[Pair, "PairWork"]], runner: MeasurementRunner, rounds: int, budget: float,
               clock: Callable[[], float], results: Dict[Pair, Measurement], unmeasured: Dict[Pair, str],
               say: Progress = None) -> None:
    """Run every pair's work ``rounds`` times round-robin within ``budget`` seconds (what
    max_seconds leaves after the setup); keep each pair's quietest round. Never start a run that
    no longer fits; a pair that failed (its errors do not go away) or was killed is not run again."""
    say = say or _quiet
    started = clock()
    longest = 0.0
    for round_number in range(1, rounds + 1):
        for index, (pair, work) in enumerate(works, start=1):
            if pair in unmeasured:
                continue
            remaining = budget - (clock() - started)
            if remaining <= longest or remaining <= 0:
                if pair not in results:
                    unmeasured[pair] = _not_started(work.options, remaining, longest)
                continue
            say("pair %d->%d (%d of %d), round %d of %d: %.0f s of max_seconds=%g left"
                % (pair + (index, len(works), round_number, rounds, remaining, work.options.max_seconds)))
            begin = clock()
            outcome = runner(work, remaining)
            took = clock() - begin
            longest = max(longest, took)
            if outcome is not None and "error" not in outcome:
                results[pair] = quieter(results.get(pair), dict(outcome, seconds=took))
            elif pair not in results:
                unmeasured[pair] = outcome["error"] if outcome else _killed(work.options, remaining)


def quieter(kept: Optional[Measurement], new: Measurement) -> Measurement:
    """The round with the lower raw chase time, with the best copy rate of both rounds."""
    if kept is None:
        return dict(new, rounds=1)
    best = dict(new if new["raw_ns"] < kept["raw_ns"] else kept)
    best["bandwidth_gbps"] = max(kept["bandwidth_gbps"], new["bandwidth_gbps"])
    best["seconds"] = kept["seconds"] + new["seconds"]
    best["rounds"] = kept["rounds"] + 1
    return best


# Both budget messages state the same budget, what it had gone to and what was left.
_BUDGET_FIX = "raise max_seconds or lower buffer_mb / chase_steps"


def _not_started(options: CostOptions, remaining: float, longest: float) -> str:
    left = max(remaining, 0.0)
    slower = ", less than the %.1f s a pair took here" % longest if longest > 0 else ""
    return ("not started: %.1f s of the max_seconds=%g budget were left (%.1f s had gone to the setup and the pairs "
            "before)%s; %s" % (left, options.max_seconds, options.max_seconds - left, slower, _BUDGET_FIX))


def _killed(options: CostOptions, remaining: float) -> str:
    return ("killed: it did not finish in the %.1f s of the max_seconds=%g budget that were left (%.1f s had gone to "
            "the setup and the pairs before); %s" % (remaining, options.max_seconds, options.max_seconds - remaining,
                                                     _BUDGET_FIX))


def _quiet(text: str) -> None:
    """The module's progress: a module can only report when it ends."""


# --- the whole report: matrices, remote share, topology key -------------------------------

def run(options: Optional[CostOptions] = None, window_seconds: float = 1.0, pids: Optional[Sequence[int]] = None,
        unit: Optional[str] = None, plan: Optional[Dict[str, Any]] = None,
        progress: Progress = None) -> Dict[str, Any]:
    """Everything ``numa_cost`` and ``numa-pin cost`` return, for the live host.

    The remote-access window comes first: the measurement's own cross-node
    allocations would otherwise count as the host's remote traffic.
    """
    check_seconds("window_seconds", window_seconds, "1")
    audit.check_pids(pids or [])
    facts = topology.read("/")
    (progress or _quiet)("sampling the allocation counters for %g s" % window_seconds)
    try:
        remote = numastat.collect("/", window_seconds, pids, unit, plan)
    except NumaError as exc:
        if pids or unit:
            raise
        remote = {"available": False, "reason": str(exc)}
    result = measure(facts, options, progress=progress)
    result["remote_ratio"] = remote
    result["topology_signature"] = topology_signature(facts)
    return result


# The last measurement numa_cost recorded on this host (record: true), which numa_weights turns into weights.
RECORD_DIR = "/var/lib/inferops-numa"
RECORD_NAME = "cost.json"
_RECORDED = ("nodes", "bandwidth_gbps", "latency_ns", "topology_signature", "elapsed_seconds")


def record(result: Dict[str, Any], state_dir: str = RECORD_DIR) -> str:
    """Keep the matrices of ``result`` (and its topology's signature) in ``state_dir``; the file's path."""
    kept = {key: result.get(key) for key in _RECORDED}
    kept["recorded_at"] = int(time.time())
    return trusted_files.write_atomically(state_dir, RECORD_NAME, json.dumps(kept, sort_keys=True) + "\n",
                                          "state directory")


def read_record(state_dir: str = RECORD_DIR) -> Optional[Dict[str, Any]]:
    """The recorded measurement, None when there is none; NumaError when it cannot be trusted."""
    return trusted_files.read_record(state_dir, RECORD_NAME, "state directory", safe_fs.PRIVATE_DIR,
                                     "remove it, or run numa_cost with record: true again")
