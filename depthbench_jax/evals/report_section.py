"""The report's domain-evaluation section: per-domain NLL by design x depth, and its depth trend.

``evals_table(runs)``: ``runs`` is a list of ``(summary, evals)`` (a run's ``summary.json`` and
its ``evals.json``) or of run records (``summary.json`` dicts with a ``workdir``, as
``report.scorecard`` passes them; their ``evals.json`` is read here, and only each (design,
shape)'s best-LR run is kept, ``sweep.best_lr_runs``, as the scorecard reports it). Returns
markdown, or None when no run has evals. A run scored on the first N examples of each set only
(``options.max_examples``) reads ``LxD (first N)``. A domain NLL reads ``2.345*`` when one of
its sets had examples cut to the scoring window (``context_cut``/``answer_cut``).

Depth trend per design (and scale family, ``record['family']``, when the scorecard set several)
and domain: the least-squares slope of NLL against ``log2(n_layers)`` (nats per doubling of
depth; negative = deeper is better), over that design's depths. Only like numbers share a slope:
runs scored on the first N examples trend apart from full-set runs (one row per N), and a
domain whose runs averaged different sets (``evals.json`` ``domains[d]['sets']``, e.g. math500
missing at one depth) or a set over other examples (``examples_sha1``: GPQA diamond at one
depth, main at another) reads ``sets differ`` rather than a slope.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Sequence

from depthbench_jax.train.summary import step_mark

DOMAINS = ("coding", "stem", "math")
TASKS = (("humaneval", "pass@1"), ("mbpp", "pass@1"), ("sciq", "acc"), ("gpqa", "acc"),
         ("gsm8k", "exact_match"), ("math500", "exact_match"))
FLAT_TOL = 0.005  # |slope| below this (nats per doubling) reads 'flat'.


def _as_pair(run: Any) -> tuple[dict, dict] | None:
  if isinstance(run, (tuple, list)):
    return run[0], run[1]
  path = os.path.join(run.get("workdir", ""), "evals.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return run, json.load(f)


def _design(summary: dict, evals: dict) -> str:
  return summary.get("design") or evals.get("design") or "?"


def _depth(summary: dict, evals: dict) -> int | None:
  if evals.get("n_layers") is not None:
    return int(evals["n_layers"])
  if summary.get("n_layers") is not None:
    return int(summary["n_layers"])
  return ((summary.get("config") or {}).get("model") or {}).get("n_layers")


def _is_number(x: Any) -> bool:
  """A value the table prints and the trend fits: not missing, not NaN."""
  return x is not None and not math.isnan(x)


def _num(x: Any, digits: int = 3) -> str:
  return f"{x:.{digits}f}" if _is_number(x) else "-"


def depth_slope(points: Sequence[tuple[int, float]]) -> float | None:
  """Least-squares slope of value against log2(depth); None with fewer than two depths."""
  pts = [(math.log2(d), v) for d, v in points if d and _is_number(v)]
  if len({x for x, _ in pts}) < 2:
    return None
  mx = sum(x for x, _ in pts) / len(pts)
  my = sum(v for _, v in pts) / len(pts)
  return (sum((x - mx) * (v - my) for x, v in pts) / sum((x - mx) ** 2 for x, _ in pts))


def _trend(slope: float | None | str, points: Sequence[tuple[int, float]] = ()) -> str:
  """The slope in words; over three or more depths whose NLL both rises and falls by more than
  ``FLAT_TOL`` between neighbours, 'non-monotonic' (the paper's word for Pre-LN's trend, which
  a slope alone reads as flat or one way)."""
  if slope is None or isinstance(slope, str):
    return slope or "-"
  ordered = sorted(points)
  steps = [b - a for (_, a), (_, b) in zip(ordered, ordered[1:])]
  if len(steps) >= 2 and max(steps) > FLAT_TOL and min(steps) < -FLAT_TOL:
    word = "non-monotonic"
  else:
    word = "flat" if abs(slope) < FLAT_TOL else ("deeper better" if slope < 0 else "deeper worse")
  return f"{slope:+.3f} ({word})"


def _cut_mark(evals: dict, domain: str) -> str:
  """``'*'`` when a set the domain averaged had examples cut to the scoring window."""
  sets = ((evals.get("domains") or {}).get(domain) or {}).get("sets") or ()
  cut = [(evals.get("sets") or {}).get(s) or {} for s in sets]
  return "*" if any(r.get("context_cut") or r.get("answer_cut") for r in cut) else ""


def _varied_sets(results: Sequence[dict]) -> set[str]:
  """The sets scored on other examples (``examples_sha1``; another file, a partial copy) in
  some of ``results`` (``evals['domains'][d]``) than in others; a result without one (older
  evals.json) differs from none."""
  seen: dict[str, set[str]] = {}
  for res in results:
    for name, sha in (res.get("examples_sha1") or {}).items():
      if sha:
        seen.setdefault(name, set()).add(sha)
  return {name for name, shas in seen.items() if len(shas) > 1}


def _domain_trend(rows: Sequence[tuple[int, dict]], domain: str) -> str:
  """``_trend`` of one domain's NLL over ``rows`` ``(depth, evals['domains'])``, or
  ``'sets differ'`` when the runs with a number averaged different sets, or a set over other
  examples (GPQA diamond at one depth, main at another)."""
  scored = [(d, doms[domain]) for d, doms in rows
            if _is_number((doms.get(domain) or {}).get("nll_per_token"))]
  if (len({tuple(sorted(res.get("sets") or ())) for _, res in scored}) > 1
      or _varied_sets([res for _, res in scored])):
    return "sets differ"
  points = [(d, res["nll_per_token"]) for d, res in scored if d]
  return _trend(depth_slope(points), points)


def _sets_note(pairs: Sequence[tuple[dict, dict]]) -> str:
  """Which sets each domain's NLL averaged: one list per domain, or, where the rows averaged
  different ones (mbpp present for one run only), each list with its rows, so two designs'
  'coding NLL' over other sets are not read as one quantity."""
  parts, different = [], False
  for domain in DOMAINS:
    rows_of: dict[str, list[str]] = {}
    varied = _varied_sets([(e.get("domains") or {}).get(domain) or {} for _, e in pairs])
    for summary, evals in pairs:
      sets = ((evals.get("domains") or {}).get(domain) or {}).get("sets")
      if sets:
        rows_of.setdefault("+".join(_set_label(evals, s, varied) for s in sorted(sets)),
                           []).append(
            f"{_design(summary, evals)} {_shape(summary, evals)}")
    if len(rows_of) == 1:
      parts.append(f"{domain} = {next(iter(rows_of))}")
    elif rows_of:
      different = True
      parts.append(f"{domain} = " + "; ".join(f"{sets} ({', '.join(rows)})"
                                             for sets, rows in sorted(rows_of.items())))
  return ("Sets averaged per domain" + (" (they differ between rows: those rows' NLLs are not "
                                        "one quantity)" if different else "")
          + ": " + "; ".join(parts) + ".")


def _set_label(evals: dict, name: str, varied: set[str]) -> str:
  """``name``, with its file and example count where the rows scored it on other examples."""
  if name not in varied:
    return name
  res = (evals.get("sets") or {}).get(name) or {}
  return f"{name} ({os.path.basename(res.get('file') or '?')}, n={res.get('n', '?')})"


def _best_lr_only(runs: Sequence[Any]) -> list[Any]:
  """Records (dicts) -> their best-LR runs; ``(summary, evals)`` pairs are kept as given."""
  from depthbench_jax.sweep import best_lr_runs
  records = [r for r in runs if isinstance(r, dict)]
  best = best_lr_runs(records) if records else []
  return [r for r in runs if not isinstance(r, dict) or any(r is b for b in best)]


def _shape(summary: dict, evals: dict) -> str:
  depth = _depth(summary, evals)
  width = summary.get("d_model") or ((summary.get("config") or {}).get("model") or {}).get(
      "d_model")
  return f"{depth or '?'}x{width}" if width else str(depth or "?")


def evals_table(runs: Sequence[Any], relative_to: str | None = None) -> str | None:
  del relative_to  # The report hook's signature (`report/__init__.py`); links nothing.
  runs = _best_lr_only(runs)
  pairs = [p for p in (_as_pair(r) for r in runs) if p is not None and p[1].get("domains")]
  if not pairs:
    return None
  pairs.sort(key=lambda p: (_design(*p), _depth(*p) or 0, p[0].get("name") or ""))
  tasks = [(s, m) for s, m in TASKS if any(m in (e.get("sets", {}).get(s) or {}) for _, e in pairs)]
  # The rows' LxD (a bare L where no run states its width); the trend rows list the depths.
  shaped = any("x" in _shape(*p) for p in pairs)
  head = (["design", "shape" if shaped else "L", "lr"] + [f"{d} NLL" for d in DOMAINS]
          + [f"{s} {m}" for s, m in tasks])
  lines = ["Teacher-forced NLL of the reference answer (nats/token; per domain = mean over its "
           "sets) and task scores.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  families = {p[0].get("family", 0) for p in pairs}
  by_design: dict[str, list[tuple[int, dict]]] = {}
  for summary, evals in pairs:
    design, depth = _design(summary, evals), _depth(summary, evals)
    doms = evals.get("domains", {})
    lr = summary.get("lr")
    limit = (evals.get("options") or {}).get("max_examples")
    # Rows made on the first N examples or at an earlier checkpoint are marked, and their
    # depth trend is apart from the full, final rows'.
    mark = (f" (first {limit})" if limit else "") + step_mark(summary, evals)
    shape = _shape(summary, evals) + mark
    row = [design, shape, "-" if lr is None else f"{lr:g}"]
    row += [_num((doms.get(d) or {}).get("nll_per_token")) + _cut_mark(evals, d)
            for d in DOMAINS]
    row += [_num((evals.get("sets", {}).get(s) or {}).get(m)) for s, m in tasks]
    lines.append("| " + " | ".join(row) + " |")
    key = design if len(families) == 1 else f"{design} (family {summary.get('family', 0)})"
    by_design.setdefault(key + mark, []).append((depth, doms))
  lines += ["", _sets_note(pairs)]
  unscored = sorted(r.get("name") or r.get("workdir", "?") for r in runs if isinstance(r, dict)
                    and not any(r is p[0] for p in pairs))
  if unscored:   # Else a design's depth trend silently skipped its unevaluated shapes.
    lines += ["", f"Not evaluated (no evals.json with domains; `python -m "
              f"depthbench_jax.evaluate --workdir=<run>`), so missing from the rows and depth "
              f"trends: {', '.join(unscored)}."]
  if any(_cut_mark(e, d) for _, e in pairs for d in DOMAINS):
    lines += ["", "*: some examples of that domain's sets exceed the scoring window (the run's "
              "seq_len): their prompts lost leading tokens, or their answers are scored on "
              "their last tokens only (evals.json context_cut, answer_cut)."]
  if any((e.get("options") or {}).get("max_examples") for _, e in pairs):
    lines += ["", "(first N): only the first N examples of each set were scored "
              "(evaluate --max_examples=N); not comparable with full-set rows."]
  if any(step_mark(*p) for p in pairs):
    lines += ["", "(step s of n): evaluated at checkpoint s of a run trained for n steps "
              "(evaluate --step, or before the run finished); its depth trend is apart."]
  lines += ["", "Depth trend: slope of domain NLL against log2(depth), nats per doubling "
            f"(negative = deeper is better; |slope| < {FLAT_TOL}: flat; non-monotonic: over "
            f"3+ depths it both rises and falls by more than {FLAT_TOL}; 'sets differ': the "
            "depths averaged different sets, or a set over other examples, no slope).", "",
            "| design | depths | " + " | ".join(DOMAINS) + " |",
            "|---|---|" + "---|" * len(DOMAINS)]
  for design, rows in sorted(by_design.items()):
    depths = sorted({d for d, _ in rows if d})
    cells = [_domain_trend(rows, dom) for dom in DOMAINS]
    lines.append(f"| {design} | {', '.join(map(str, depths))} | " + " | ".join(cells) + " |")
  return "\n".join(lines)
