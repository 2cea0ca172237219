#!/usr/bin/env python3
"""The op-coverage check: every op the recorder saw the portable graph run must be one Candle's Metal backend
implements for its dtypes and input layouts, by the table metal_table.py read from Candle's source.

    python3 tools/op-recorder/check.py RECORDS.jsonl [--table tools/op-recorder/metal-ops-candle-X.json]

Prints each unsupported (op, dtypes, layouts) with the cases that ran it and exits 1; prints a summary (distinct
ops, ops per case) and exits 0 when all are covered. A case that failed to run is an error too.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def branch(layout: str) -> str:
    return "c" if layout == "c" else "x"


def gemm_layout_ok(layout: str) -> bool:
    """candle-metal-kernels' mlx gemm accepts an operand whose last two strides make it row-major or its transpose
    (mlx_gemm.rs: MatMulNonContiguous otherwise). `layout` is "c" or "x:<dims>:<strides>"."""
    if layout in ("c", "s"):
        return True
    _, dims, strides = layout.split(":", 2)
    dims, strides = json.loads(dims), json.loads(strides)
    rows, cols = dims[-2], dims[-1]
    m1, m2 = strides[-1], strides[-2]
    row_major = (m1 == 1 or cols == 1) and (m2 == cols or rows == 1)
    col_major = (m1 == rows or cols == 1) and (m2 == 1 or rows == 1)
    return row_major or col_major


def supported(rec: dict, ops: dict) -> str | None:
    """None when Metal has it; else why not."""
    op, dt, lay = rec["op"], rec["dtypes"], rec["layouts"]
    kind, _, sub = op.partition(":")
    if op in ("affine", "powf", "elu", "const_set"):
        ok = dt[0] in ops[op][branch(lay[0])]
        return None if ok else f"no {'contiguous' if lay[0] == 'c' else 'strided'} {op} kernel for {dt[0]}"
    if op == "to_dtype":
        key = f"{dt[0]},{dt[1]}"
        return None if key in ops["to_dtype"][branch(lay[0])] else f"no cast {dt[0]} -> {dt[1]} ({branch(lay[0])})"
    if kind == "unary":
        key = f"{sub},{dt[0]}"
        return None if key in ops["unary_impl"][branch(lay[0])] else f"no {'strided ' if lay[0] != 'c' else ''}{sub} for {dt[0]}"
    if kind == "reduce":
        key = f"{sub},{dt[0]}"
        return None if key in ops["reduce_op"][branch(lay[0])] else f"no {sub} reduction for {dt[0]} ({lay[0]})"
    if kind == "binary":
        return None if dt[0] in ops["binary"].get(sub, []) else f"no {sub} kernel for {dt[0]}"
    if kind == "cmp":
        return None if dt[0] in ops["cmp"].get(sub, []) else f"no {sub} comparison for {dt[0]}"
    if op == "where_cond":
        return None if f"{dt[0]},{dt[1]}" in ops["where_cond"] else f"no where_cond with a {dt[0]} mask on {dt[1]}"
    if op in ("gather", "index_select", "index_add", "scatter_add", "scatter_set"):
        table = ops["scatter_add_set" if op == "scatter_add" else op]
        if op in ("gather", "index_select") and lay[0] != "c":
            return f"{op} needs contiguous ids"
        return None if f"{dt[0]},{dt[1]}" in table else f"no {op} of {dt[1]} by {dt[0]} ids"
    if op == "matmul":
        if dt[0] not in ops["matmul"]:
            return f"no matmul for {dt[0]}"
        return None if all(gemm_layout_ok(l) for l in lay) else f"matmul operand strides Metal's gemm refuses {lay}"
    if op == "copy_strided_src":
        if lay[0] == "c" and dt[0] == dt[1]:
            return None  # a blit
        if dt[0] != dt[1]:
            return f"strided copy between dtypes {dt[0]} -> {dt[1]}"
        return None if dt[0] in ops["copy_strided"] or dt[0] in ops["copy2d"] else f"no strided copy for {dt[0]}"
    if op == "copy2d":
        return None if lay[0] == "c" or dt[0] in ops["copy2d"] else f"no copy2d for {dt[0]}"
    if op == "custom:frozen-matmul":
        # Ours (src/engine/ops/frozen_matmul.rs): its metal_fwd runs the backend's matmul on the contiguous input
        # and the weight (a contiguous matrix or its transpose, both of which Metal's gemm takes).
        return None if dt[0] in ops["matmul"] and lay[0] == "c" else f"frozen-matmul: no Metal gemm for {dt[0]} {lay}"
    if kind == "custom":
        c = ops["custom"].get(sub)
        if c is None:
            return f"custom op {sub} has no Metal kernel in candle-nn"
        if dt[0] not in c["dtypes"]:
            return f"custom op {sub} has no Metal kernel for {dt[0]}"
        if c["contiguous_only"] and any(l != "c" for l in lay):
            return f"custom op {sub} needs contiguous inputs on Metal"
        return None
    return f"{op} is not in the table"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("records")
    ap.add_argument("--table", default=None)
    args = ap.parse_args()
    table_path = Path(args.table) if args.table else sorted(HERE.glob("metal-ops-candle-*.json"))[-1]
    ops = json.loads(table_path.read_text())["ops"]
    missing: dict = {}
    failed, distinct, lines = [], set(), []
    per_step = []
    for line in Path(args.records).read_text().splitlines():
        case = json.loads(line)
        if "ops_per_step" in case:
            per_step.append(case)
            continue
        lines.append(case)
        if not case["ok"]:
            failed.append(f"{case['case']} ({case['dtype']}): {case['error']}")
        for rec in case["records"]:
            key = (rec["op"], tuple(rec["dtypes"]), tuple(rec["layouts"]))
            distinct.add(key)
            why = supported(rec, ops)
            if why:
                missing.setdefault((key, why), []).append(f"{case['case']} ({case['dtype']})")
    print(f"{len(lines)} cases, {len(distinct)} distinct (op, dtypes, layouts) records; table {table_path.name}")
    for p in per_step:
        wgsl = p.get("wgsl_launches_per_step", 0)
        launches = f" + {wgsl} WGSL launches ({p['ops_per_step'] + wgsl} dispatches)" if wgsl else ""
        print(f"ops per SFT step ({p['family']}, {p['dtype']}, batch {p['batch']} x {p['seq_len']}, "
              f"kernels {p.get('kernels', 'portable')}): {p['ops_per_step']}{launches}")
    for (key, why), cases in sorted(missing.items()):
        print(f"UNSUPPORTED on Metal: {key[0]} {list(key[1])} {list(key[2])}: {why}\n    in {', '.join(cases[:6])}"
              + (f" and {len(cases) - 6} more" if len(cases) > 6 else ""))
    for f in failed:
        print(f"CASE FAILED: {f}")
    sys.exit(1 if missing or failed else 0)


if __name__ == "__main__":
    main()
