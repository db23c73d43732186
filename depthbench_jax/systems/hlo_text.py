"""Facts about the ops of a compiled XLA program, read from its HLO text (``compiled.as_text()``).

What ``profile_step`` needs to put a trace's kernels next to the model and to the memory they
move: each instruction's jax source op (``op_names``), result type (``op_shapes``) and the
bytes it reads and writes (``op_bytes``). Instruction names are unique in a module, so one
table covers the entry, loop bodies and fused computations alike.
"""

from __future__ import annotations

import math
import re

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
_HEADER = re.compile(r"(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")   # a computation's first line
_NAME = r"\s*(?:ROOT )?%?([\w.\-]+) = "                   # an instruction's name
_TYPE = r"(\(.*?\)|\w+\[[\d,]*\])"    # its result type: an array's without layout, a tuple whole
_DEFINITION = re.compile(_NAME)
_TYPED = re.compile(_NAME + _TYPE)
_INSTRUCTION = re.compile(_NAME + _TYPE + r"(?:\{[\d,]*\})? ([\w\-]+)\((.*?)\)")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")


def op_names(hlo_text: str) -> dict[str, str]:
  """HLO instruction name -> its ``op_name`` metadata (the jax source op).

  A fusion that XLA built without metadata (XLA:GPU's multi-output and reduce fusions often
  are) takes the op_name of the last instruction of its fused computation that has one: the
  op nearest its root.
  """
  out, last_in_computation, calls = {}, {}, {}
  computation = None
  for line in hlo_text.splitlines():
    header = _HEADER.match(line)
    if header and not line.startswith(" "):
      computation = header.group(1)
      continue
    m = _DEFINITION.match(line)
    if not m:
      continue
    named = re.search(r'metadata=\{op_name="([^"]+)"', line)
    if named:
      out[m.group(1)] = named.group(1)
      last_in_computation[computation] = named.group(1)
    else:
      called = _CALLS.search(line)
      if called:
        calls[m.group(1)] = called.group(1)
  for name, computation in calls.items():
    if computation in last_in_computation:
      out[name] = last_in_computation[computation]
  return out


def op_shapes(hlo_text: str) -> dict[str, str]:
  """HLO instruction name -> its result type, an array's without layout (``'bf16[4,8,2048,1216]'``),
  a tuple's as printed, layouts included (``'(bf16[4,8]{1,0}, f32[])'``)."""
  out = {}
  for line in hlo_text.splitlines():
    m = _TYPED.match(line)
    if m:
      out[m.group(1)] = m.group(2)
  return out


def type_bytes(hlo_type: str) -> int:
  """Bytes of an HLO type, tuples summed: ``'(bf16[4,8]{1,0}, f32[])'`` -> 68."""
  return sum(_DTYPE_BYTES.get(dtype, 0) * math.prod(int(d) for d in dims.split(",") if d)
             for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", hlo_type))


def _instructions(hlo_text: str) -> dict[str, list[tuple[str, str, str, list[str], str]]]:
  """Computation name -> its instructions as (name, result type, opcode, operands, called
  computation or '')."""
  out: dict[str, list] = {}
  current = None
  for line in hlo_text.splitlines():
    header = _HEADER.match(line)
    if header and not line.startswith(" "):
      current = out.setdefault(header.group(1), [])
      continue
    m = _INSTRUCTION.match(line)
    if current is not None and m:
      operands = re.findall(r"%([\w.\-]+)", re.sub(r"/\*.*?\*/", "", m.group(4)))
      if m.group(3) == "parameter":
        operands = [m.group(4)]           # its index
      called = _CALLS.search(line)
      current.append((m.group(1), m.group(2), m.group(3), operands,
                      called.group(1) if called else ""))
  return out


def _parameter_read(body: list, index: int, full: int) -> int:
  """Bytes a fused computation reads of its parameter ``index``: the slices, if dynamic
  slices are its only users, else the whole operand."""
  param = next((name for name, _, opcode, ops, _ in body
                if opcode == "parameter" and ops == [str(index)]), None)
  users = [(t, opcode, ops) for _, t, opcode, ops, _ in body if param in ops]
  if param and users and all(opcode == "dynamic-slice" and ops[0] == param
                             for _, opcode, ops in users):
    return sum(type_bytes(t) for t, _, _ in users)
  return full


def _in_place_update(body: list, sizes: dict) -> tuple[int, int] | None:
  """(index of the buffer parameter, bytes of the update) if the fused computation's root is
  a dynamic-update-slice of one of its parameters (XLA runs it in place: only the update is
  written), else None."""
  if not body or body[-1][2] != "dynamic-update-slice":
    return None
  _, _, _, (buffer, update, *_), _ = body[-1]
  index = next((int(ops[0]) for name, _, opcode, ops, _ in body
                if opcode == "parameter" and name == buffer), None)
  return None if index is None else (index, sizes.get(update, 0))


def op_bytes(hlo_text: str) -> dict[str, int]:
  """HLO instruction name -> the bytes it moves: its result plus its operands.

  A fusion operand that the fused computation only reads through ``dynamic-slice`` (a layer's
  slice of a stacked array inside the scan body) counts as the slices read, not the whole
  array; a dynamic-update-slice into a buffer (in place) counts the update, not the buffer.
  An operand read twice or broadcast counts once: a lower bound on the traffic, so bytes /
  time is an upper bound on the bandwidth a kernel reached.
  """
  computations = _instructions(hlo_text)
  sizes = {name: type_bytes(t) for body in computations.values() for name, t, *_ in body}
  out = {}
  for body in computations.values():
    for name, _, opcode, operands, called in body:
      if opcode == "parameter":
        continue
      fused = computations.get(called, []) if opcode == "fusion" else []
      in_place = (_in_place_update(fused, sizes) if fused else
                  (0, sizes.get(operands[1], 0)) if opcode == "dynamic-update-slice" else None)
      total, seen = (in_place[1] if in_place else sizes[name]), set()
      for index, operand in enumerate(operands):
        if operand in seen or (in_place and index == in_place[0]):
          continue
        seen.add(operand)
        full = sizes.get(operand, 0)
        total += _parameter_read(fused, index, full) if fused else full
      out[name] = total
  return out
