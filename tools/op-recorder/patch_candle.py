#!/usr/bin/env python3
"""Make the recording copy of candle-core the op recorder builds against (nothing of Candle is kept in this repo).

Copies candle-core from cargo's registry (the version Cargo.lock pins) into target/op-recorder/candle-core, adds a
module `op_record` (a process-wide switch and a list of records) and, at the top of each `Storage` method that runs
a kernel (storage.rs: every op of every backend passes through one of them), one call that records the op, its
dtypes and the layouts of its inputs. The recording is off unless `candle_core::op_record::start()` was called.

    python3 tools/op-recorder/patch_candle.py            # prints the patched crate's path
"""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "target" / "op-recorder" / "candle-core"

# What each Storage method records: name -> Rust expression of an `op_record::Record` (evaluated only while
# recording). `lay` renders a layout as "c" (contiguous), "s" (scalar-like) or "x" (strided) with its strides.
RECORDS = {
    "const_set": 'R::new("const_set", &[self.dtype()], &[l])',
    "affine": 'R::new("affine", &[self.dtype()], &[layout])',
    "powf": 'R::new("powf", &[self.dtype()], &[layout])',
    "elu": 'R::new("elu", &[self.dtype()], &[layout])',
    "cmp": 'R::new(&format!("cmp:{}", match op { crate::op::CmpOp::Eq => "eq", crate::op::CmpOp::Ne => "ne", '
           'crate::op::CmpOp::Le => "le", crate::op::CmpOp::Ge => "ge", crate::op::CmpOp::Lt => "lt", '
           'crate::op::CmpOp::Gt => "gt" }), &[self.dtype()], &[lhs_layout, rhs_layout])',
    "reduce_op": 'R::reduce(&format!("reduce:{op:?}"), self.dtype(), layout, s)',
    "to_dtype": 'R::new("to_dtype", &[self.dtype(), dtype], &[layout])',
    "apply_op1": 'R::new(&format!("custom:{}", c.name()), &[self.dtype()], &[l])',
    "apply_op2": 'R::new(&format!("custom:{}", c.name()), &[self.dtype(), t2.dtype()], &[l1, l2])',
    "apply_op3": 'R::new(&format!("custom:{}", c.name()), &[self.dtype(), t2.dtype(), t3.dtype()], &[l1, l2, l3])',
    "inplace_op": 'R::new(&format!("inplace:{}", c.name()), &[self.dtype()], &[dst_l])',
    "unary_impl": 'R::new(&format!("unary:{}", B::KERNEL), &[self.dtype()], &[layout])',
    "binary_impl": 'R::new(&format!("binary:{}", B::KERNEL), &[self.dtype(), rhs.dtype()], &[lhs_layout, rhs_layout])',
    "where_cond": 'R::new("where_cond", &[self.dtype(), t.dtype()], &[layout, layout_t, layout_f])',
    "gather": 'R::new("gather", &[indexes.dtype(), self.dtype()], &[indexes_l, l])',
    "scatter_set": 'R::new("scatter_set", &[indexes.dtype(), self.dtype()], &[indexes_l, l, source_l])',
    "scatter_add": 'R::new("scatter_add", &[indexes.dtype(), self.dtype()], &[indexes_l, l, source_l])',
    "index_add": 'R::new("index_add", &[indexes.dtype(), self.dtype()], &[indexes_l, l, source_l])',
    "index_select": 'R::new("index_select", &[rhs.dtype(), self.dtype()], &[rhs_l, lhs_l])',
    "matmul": 'R::new("matmul", &[self.dtype(), rhs.dtype()], &[lhs_layout, rhs_layout])',
    "copy_strided_src": 'R::new("copy_strided_src", &[self.dtype(), dst.dtype()], &[src_l])',
    "copy2d": 'R::copy2d(self.dtype(), d2, src_s, dst_s)',
}

MODULE = r'''//! Op recording for metal-candle's op recorder (added by tools/op-recorder/patch_candle.py; not part of Candle).
use crate::{DType, Layout};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static ON: AtomicBool = AtomicBool::new(false);
static RECORDS: Mutex<Vec<Record>> = Mutex::new(Vec::new());

/// One op as a backend received it: its name, the dtypes of its operands, and each input layout as "c"
/// (contiguous), "s" (scalar-like: every stride 0 or a single element) or "x:<strides>" (strided).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Record {
    pub op: String,
    pub dtypes: Vec<String>,
    pub layouts: Vec<String>,
}

fn lay(l: &Layout) -> String {
    if l.is_scalar_like() && l.shape().elem_count() > 1 {
        "s".into()
    } else if l.is_contiguous() {
        "c".into()
    } else {
        format!("x:{:?}:{:?}", l.dims(), l.stride())
    }
}

fn dt(d: DType) -> String {
    d.as_str().to_string()
}

impl Record {
    pub(crate) fn new(op: &str, dtypes: &[DType], layouts: &[&Layout]) -> Self {
        Self { op: op.into(), dtypes: dtypes.iter().map(|d| dt(*d)).collect(), layouts: layouts.iter().map(|l| lay(l)).collect() }
    }
    /// A reduction, with Metal's test for its contiguous kernel: a contiguous input reduced over its last dims.
    pub(crate) fn reduce(op: &str, dtype: DType, l: &Layout, dims: &[usize]) -> Self {
        let rank = l.dims().len();
        let trailing = dims.iter().enumerate().all(|(i, d)| *d == rank - dims.len() + i);
        let class = match (l.is_contiguous(), trailing) {
            (true, true) => "c".to_string(),
            (true, false) => "x:reduced-inner".to_string(),
            (false, _) => lay(l),
        };
        Self { op: op.into(), dtypes: vec![dt(dtype)], layouts: vec![class] }
    }
    pub(crate) fn copy2d(dtype: DType, d2: usize, src_s: usize, dst_s: usize) -> Self {
        let class = if src_s == d2 && dst_s == d2 { "c" } else { "x:rows" };
        Self { op: "copy2d".into(), dtypes: vec![dt(dtype)], layouts: vec![class.into()] }
    }
}

/// Starts recording (clears what was recorded).
pub fn start() {
    RECORDS.lock().unwrap().clear();
    ON.store(true, Ordering::SeqCst);
}

/// Stops recording and returns every op recorded since `start`, in order.
pub fn take() -> Vec<Record> {
    ON.store(false, Ordering::SeqCst);
    std::mem::take(&mut *RECORDS.lock().unwrap())
}

#[inline]
pub(crate) fn note(make: impl FnOnce() -> Record) {
    if ON.load(Ordering::Relaxed) {
        let r = make();
        RECORDS.lock().unwrap().push(r);
    }
}
'''


def registry_copy() -> Path:
    lock = (ROOT / "Cargo.lock").read_text()
    version = re.search(r'name = "candle-core"\nversion = "([^"]+)"', lock).group(1)
    hits = sorted(Path.home().glob(f".cargo/registry/src/*/candle-core-{version}"))
    if not hits:
        sys.exit(f"candle-core {version} is not in cargo's registry: run `cargo fetch` first")
    return hits[0]


def main() -> None:
    src = registry_copy()
    if OUT.exists():
        shutil.rmtree(OUT)
    shutil.copytree(src, OUT)
    (OUT / "src" / "op_record.rs").write_text(MODULE)
    lib = OUT / "src" / "lib.rs"
    lib.write_text(lib.read_text() + "\npub mod op_record;\n")
    storage = OUT / "src" / "storage.rs"
    text = storage.read_text()
    for name, expr in RECORDS.items():
        m = re.search(r"pub\(crate\) fn " + name + r"\b[^{]*?\)\s*->\s*Result<[^{]*\{", text, flags=re.S)
        if not m:
            sys.exit(f"storage.rs: no method {name} (a Candle upgrade? update RECORDS)")
        call = "\n        crate::op_record::note(|| { use crate::op_record::Record as R; " + expr + " });"
        text = text[: m.end()] + call + text[m.end():]
    storage.write_text(text)
    print(OUT)


if __name__ == "__main__":
    main()
