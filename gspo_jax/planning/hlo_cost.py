"""FLOPs and HBM bytes of a compiled program, per device, with every loop counted its trip count.

    cost = hlo_cost.program_cost(compiled, unknown_trips=T)   # Cost(flops, bytes, ragged_flops)

XLA's own ``compiled.cost_analysis()`` counts the body of a while loop once, whatever its trip
count. Here the decoder layers run under a scan (a while loop of L trips), the update scans its
minibatches, micro-batches and log-prob chunks, and the rollout decodes in a while loop, so its
figures would miss most of the work. This module reads the compiled (per-device, partitioned)
HLO text instead and counts, the way XLA's cost analysis does:

    flops   2 x (output elements) x (contracted elements) of every dot (matmuls carry nearly all
            the FLOPs of a decoder; elementwise work is not counted)
    bytes   operands read and results written by every top-level instruction (a fusion is one
            instruction: its intermediates stay on chip); a dynamic-slice, and a fusion operand
            used only through dynamic-slices, counts the slice it reads; an in-place
            dynamic-update-slice counts the update it writes; likewise a gather counts the
            rows it gathers and an in-place scatter the updates it writes (the paged KV cache
            is read and written through them: its pool is far larger than what a decode step
            touches). Inside a fusion, dtype converts
            and views are looked through, and a fusion that only slices / converts an operand
            counts nothing (its consumer's read counts): XLA:CPU wraps bf16 slices and updates
            in f32 converts, which a TPU does not do. Reads of such f32 copies still count
            at f32 width, so bf16 programs read high.
    ops     top-level instructions executed (a fusion, dot, gather, scatter, copy ...: each a
            kernel launch or a pass over memory; views, tuples and control flow are free): the
            fixed work of a step, which fewer, larger fused ops cut

each multiplied by the trip counts of the loops around it (XLA's ``known_trip_count``; a loop
whose count is data-dependent, such as the sampler's stop-at-EOS decode loop, counts
``unknown_trips``, its maximum).

ragged_dot: XLA:CPU lowers ``jax.lax.ragged_dot`` (the sparse MoE's grouped matmul) to a masked
dense matmul over all G groups, G times the work a TPU kernel does (and its HLO no longer says
ragged_dot). Given the traced jaxpr, program_cost takes that dense count out of ``flops`` and
counts the ragged_dots from their shapes instead (``ragged_dot_flops``: 2 x M x K x N per
group-sum, divided over the devices), reported apart as ``ragged_flops``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from jax.extend import core as jax_core

_DTYPE_BYTES = {
    "pred": 1,
    "s4": 1,
    "u4": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
}
_ARRAY = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
# Instructions that move no data themselves (views, control flow counted through its bodies).
_FREE = {
    "parameter",
    "constant",
    "tuple",
    "get-tuple-element",
    "bitcast",
    "while",
    "call",
    "conditional",
    "after-all",
    "partition-id",
    "replica-id",
    "iota",
    "opt-barrier",
}


_VIEWS = {"convert", "bitcast", "reshape", "copy"}  # looked through inside a fusion
# A fusion of only these ops slices or retypes one operand for its consumer (the CPU's bf16 ->
# f32 upcast of a cache layer before a matmul); a TPU fuses that into the consumer's read.
_MOVES = _VIEWS | {"parameter", "constant", "dynamic-slice", "slice"}


@dataclasses.dataclass(frozen=True)
class Cost:
    flops: float  # dot FLOPs per device (ragged_dot excluded, see ragged_flops)
    bytes: float  # HBM bytes read + written per device
    ragged_flops: float = 0.0  # ragged_dot FLOPs per device, from the jaxpr's shapes
    ops: float = 0.0  # top-level instructions executed (kernels launched), trips counted

    @property
    def total_flops(self) -> float:
        return self.flops + self.ragged_flops

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.flops + other.flops,
            self.bytes + other.bytes,
            self.ragged_flops + other.ragged_flops,
            self.ops + other.ops,
        )

    def __mul__(self, n: float) -> Cost:
        return Cost(self.flops * n, self.bytes * n, self.ragged_flops * n, self.ops * n)


def _shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape string (an array or a tuple of arrays)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        if dtype in _DTYPE_BYTES:
            total += _DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
    return total


def _dims(shape: str) -> list[int]:
    m = _ARRAY.search(shape)
    return [int(d) for d in m.group(2).split(",") if d] if m else []


@dataclasses.dataclass
class _Instr:
    name: str
    shape: str
    opcode: str
    operands: list[str]
    attrs: str
    root: bool = False


def _split_top(text: str) -> list[str]:
    """Comma-separated items of `text` at bracket depth 0."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def _close(text: str, start: int) -> int:
    """Index of the parenthesis closing the one at text[start]."""
    depth = 0
    for j in range(start, len(text)):
        depth += text[j] == "("
        depth -= text[j] == ")"
        if depth == 0:
            return j
    return len(text)


def _parse_instr(line: str) -> _Instr | None:
    line = line.strip()
    root = line.startswith("ROOT ")
    if root:
        line = line[5:]
    if not line.startswith("%") or " = " not in line:
        return None
    name, rest = line.split(" = ", 1)
    if rest.startswith("("):  # tuple shape: up to the matching parenthesis
        end = _close(rest, 0)
        shape, rest = rest[: end + 1], rest[end + 1 :].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    opcode, _, rest = rest.partition("(")
    i = _close("(" + rest, 0)  # rest[i - 1] closes the operand list
    operands = [o.split()[-1] for o in _split_top(rest[: i - 1]) if o.split()]
    operands = [o.lstrip("%") for o in operands]
    return _Instr(name.lstrip("%"), shape, opcode, operands, rest[i:], root)


def _computations(text: str) -> tuple[dict[str, list[_Instr]], str]:
    """HLO module text -> (computation name -> instructions, the entry computation's name)."""
    comps: dict[str, list[_Instr]] = {}
    entry, current = "", None
    for line in text.splitlines():
        s = line.strip()
        if s.endswith("{") and "=" not in s.split("(")[0]:
            head = s.split()[1 if s.startswith("ENTRY") else 0]
            current = head.lstrip("%")
            comps[current] = []
            if s.startswith("ENTRY"):
                entry = current
        elif s == "}":
            current = None
        elif current is not None:
            ins = _parse_instr(s)
            if ins is not None:
                comps[current].append(ins)
    return comps, entry


def _attr(attrs: str, key: str) -> str | None:
    m = re.search(rf"\b{key}=%?([\w.\-]+)", attrs)
    return m.group(1) if m else None


def _trip_count(attrs: str) -> int | None:
    m = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', attrs)
    return int(m.group(1)) if m else None


class _Walker:
    def __init__(self, text: str, unknown_trips):
        self.comps, self.entry = _computations(text)
        self.unknown_trips = unknown_trips
        self.shapes = {i.name: i.shape for c in self.comps.values() for i in c}
        self.memo: dict[str, tuple[float, float, float]] = {}

    def dot_flops(self, ins: _Instr) -> float:
        lhs = _dims(self.shapes.get(ins.operands[0], ""))
        m = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", ins.attrs)
        contracting = [int(d) for d in m.group(1).split(",") if d] if m else []
        k = math.prod(lhs[d] for d in contracting) if lhs else 0
        return 2.0 * math.prod(_dims(ins.shape)) * k

    def fused_flops(self, comp: str) -> float:
        total = 0.0
        for ins in self.comps.get(comp, []):
            if ins.opcode == "dot":
                total += self.dot_flops(ins)
            elif ins.opcode == "fusion":
                total += self.fused_flops(_attr(ins.attrs, "calls") or "")
        return total

    def fusion_bytes(self, ins: _Instr) -> float:
        """Bytes a fusion reads and writes. Looking through dtype converts and views (which the
        CPU compiler adds around bf16 ops a TPU runs natively): an operand the fused code only
        slices counts the slices, the buffer of an in-place dynamic-update-slice counts nothing,
        and a result that is that buffer counts the update written into it."""
        body = self.comps.get(_attr(ins.attrs, "calls") or "", [])
        if all(b.opcode in _MOVES for b in body):
            return 0.0  # a slice / dtype change of an operand only: fused into its consumer
        by_name = {b.name: b for b in body}
        users: dict[str, list[_Instr]] = {}
        for b in body:
            for o in b.operands:
                users.setdefault(o, []).append(b)

        def sinks(name: str) -> list[tuple[_Instr, str]]:  # (consumer, operand) past views
            out = []
            for u in users.get(name, []):
                out += sinks(u.name) if u.opcode in _VIEWS else [(u, name)]
            return out

        def source(name: str) -> _Instr | None:  # the op under a chain of views
            b = by_name.get(name)
            while b is not None and b.opcode in _VIEWS:
                b = by_name.get(b.operands[0])
            return b

        total = 0.0
        params = {int(b.operands[0]): b for b in body if b.opcode == "parameter"}
        for j, operand in enumerate(ins.operands):
            p = params.get(j)
            full = _shape_bytes(self.shapes.get(operand, ""))
            used = sinks(p.name) if p is not None else []
            itemsize = full / max(math.prod(_dims(self.shapes.get(operand, ""))), 1)
            if used and all(
                u.opcode in ("dynamic-slice", "slice")
                or (u.opcode == "gather" and u.operands[0] == o)
                for u, o in used
            ):
                total += sum(math.prod(_dims(u.shape)) * itemsize for u, _ in used)
            elif used and all(
                u.opcode in ("dynamic-update-slice", "scatter") and u.operands[0] == o
                for u, o in used
            ):
                pass  # updated in place
            else:
                total += full
        root = next((b for b in body if b.root), None)
        dus = source(root.name) if root is not None else None
        if dus is not None and dus.opcode in ("dynamic-update-slice", "scatter"):
            out_item = _shape_bytes(ins.shape) / max(math.prod(_dims(ins.shape)), 1)
            update = dus.operands[1 if dus.opcode == "dynamic-update-slice" else 2]
            total += math.prod(_dims(by_name[update].shape)) * out_item
        else:
            total += _shape_bytes(ins.shape)
        return total

    def cost(self, comp: str) -> tuple[float, float, float]:
        """(flops, bytes, ops) of one execution of computation `comp`; ops counts the
        instructions that run as a kernel of their own (a fusion, a dot, a scatter, ...; not
        views, tuples or control flow), each time it runs."""
        if comp in self.memo:
            return self.memo[comp]
        flops = nbytes = ops = 0.0

        def add(cost, times=1):
            nonlocal flops, nbytes, ops
            flops, nbytes, ops = (
                flops + times * cost[0],
                nbytes + times * cost[1],
                ops + times * cost[2],
            )

        for ins in self.comps.get(comp, []):
            op = ins.opcode
            if op == "while":
                trips = _trip_count(ins.attrs)
                if trips is None:
                    u = self.unknown_trips
                    body = _attr(ins.attrs, "body") or ""
                    trips = u(self.comps.get(body, [])) if callable(u) else u
                for key in ("body", "condition"):
                    add(self.cost(_attr(ins.attrs, key) or ""), trips)
                continue
            if op in ("call", "async-start"):
                add(self.cost(_attr(ins.attrs, "to_apply") or _attr(ins.attrs, "calls") or ""))
                continue
            if op == "conditional":
                m = re.search(r"branch_computations=\{([^}]*)\}", ins.attrs)
                branches = [c.strip().lstrip("%") for c in m.group(1).split(",")] if m else []
                add(max([self.cost(c) for c in branches] or [(0.0, 0.0, 0.0)]))
                continue
            if op in _FREE:
                continue
            ops += 1
            if op == "dynamic-slice":
                nbytes += 2 * _shape_bytes(ins.shape)
            elif op == "dynamic-update-slice":
                nbytes += 2 * _shape_bytes(self.shapes.get(ins.operands[1], ""))
            elif op == "gather":  # the gathered rows, read and written, and the indices
                nbytes += 2 * _shape_bytes(ins.shape)
                nbytes += _shape_bytes(self.shapes.get(ins.operands[1], ""))
            elif op == "scatter":  # in place: the updates and the indices
                nbytes += 2 * _shape_bytes(self.shapes.get(ins.operands[2], ""))
                nbytes += _shape_bytes(self.shapes.get(ins.operands[1], ""))
            elif op == "fusion":
                flops += self.fused_flops(_attr(ins.attrs, "calls") or "")
                nbytes += self.fusion_bytes(ins)
            else:
                if op == "dot":
                    flops += self.dot_flops(ins)
                operands = sum(_shape_bytes(self.shapes.get(o, "")) for o in ins.operands)
                nbytes += operands + _shape_bytes(ins.shape)
        self.memo[comp] = (flops, nbytes, ops)
        return self.memo[comp]


def hlo_text_cost(text: str, unknown_trips: int = 1) -> tuple[float, float]:
    """(dot FLOPs, bytes) of the HLO module `text` (see the module docstring)."""
    return hlo_text_costs(text, unknown_trips)[:2]


def hlo_text_costs(text: str, unknown_trips=1) -> tuple[float, float, float]:
    """(dot FLOPs, bytes, ops executed) of the HLO module `text` (_Walker.cost). unknown_trips:
    the trips of a loop whose count is data-dependent, or a function of its body's instructions
    (a list with .shape strings) giving them, for a program with several such loops."""
    w = _Walker(text, unknown_trips)
    return w.cost(w.entry)


def ragged_dot_flops(jaxpr: Any, unknown_trips: int = 1) -> tuple[float, float]:
    """(FLOPs, FLOPs of XLA:CPU's dense lowering) of the ragged_dots of a (closed) jaxpr, global.

    A ragged_dot(lhs [M, K], rhs [G, K, N]) does 2 x M x K x N (each of the M rows meets the
    weights of its one group); the CPU lowers it as one dense matmul over all G groups' masked
    copies, G times that. Counts through scans (times their length), while loops (times
    unknown_trips), shard_map bodies (times the devices they run on) and other sub-jaxprs once.
    """
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    true = dense = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name.startswith("ragged_dot"):
            lhs = eqn.invars[0].aval.shape
            groups = eqn.invars[2].aval.shape[-1]
            dims = eqn.params.get("ragged_dot_dimension_numbers")
            if dims is not None:
                (lhs_contract, _), _ = dims.dot_dimension_numbers
                k = math.prod(lhs[d] for d in lhs_contract)
            else:
                k = lhs[-1]
            f = 2.0 * math.prod(eqn.outvars[0].aval.shape) * k
            true, dense = true + f, dense + groups * f
            continue
        times = 1
        if name == "scan":
            times = eqn.params["length"]
        elif name == "while":
            times = unknown_trips
        elif name == "shard_map":
            times = eqn.params["mesh"].size
        for sub in jax_core.jaxprs_in_params(eqn.params):
            t, d = ragged_dot_flops(sub, unknown_trips)
            true, dense = true + times * t, dense + times * d
    return true, dense


def program_cost(compiled, unknown_trips: int = 1, jaxpr: Any = None, devices: int = 1) -> Cost:
    """Cost per device of a jax.stages.Compiled: HLO dots and bytes (module docstring), with the
    ragged_dots of `jaxpr` (the traced program) counted from their shapes, split over `devices`,
    in place of the dense matmuls XLA:CPU lowers them to."""
    flops, nbytes, ops = hlo_text_costs(compiled.as_text(), unknown_trips)
    if jaxpr is None:
        return Cost(flops, nbytes, ops=ops)
    # (a function of the loop body counts the jaxpr's data-dependent loops once)
    true, dense = ragged_dot_flops(jaxpr, 1 if callable(unknown_trips) else unknown_trips)
    return Cost(max(flops - dense / devices, 0.0), nbytes, true / devices, ops)
