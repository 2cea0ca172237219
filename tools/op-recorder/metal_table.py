#!/usr/bin/env python3
"""What Candle's Metal backend implements, read from Candle's own source: writes metal-ops-candle-<version>.json beside
this script (or to `--out FILE`).

Sources (cargo's registry copies of the versions Cargo.lock pins):
- candle-core's `metal_backend/mod.rs`: for each backend method, the dtype match arms that name a kernel, split into
  the contiguous and the strided branch (a strided kernel's name says `strided`; a method with one branch serves
  both); everything else falls through to `bail!("... not implemented")`.
- candle-metal-kernels' `binary.metal`: which dtypes each binary and comparison kernel is instantiated for (the
  backend formats their names at run time), and which only with `__HAVE_BFLOAT__` (Metal 3.1, macOS 14).
- candle-nn's `ops.rs` and `rotary_emb.rs`: the custom ops' `name()` and the dtypes their `metal_fwd` names kernels
  for; whether `metal_fwd` refuses strided inputs.

The table is regenerated when Candle is upgraded (`python3 tools/op-recorder/metal_table.py`); a method this script
cannot find stops it with a message, so an upgrade that moves things cannot leave a stale table silently.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DTYPE = {"F32": "f32", "F16": "f16", "BF16": "bf16", "F64": "f64", "U8": "u8", "U32": "u32", "I64": "i64",
         "I16": "i16", "I32": "i32", "F8E4M3": "f8e4m3"}
PATH_DTYPE = {"FLOAT": "f32", "HALF": "f16", "BFLOAT": "bf16", "I64": "i64", "U32": "u32", "U8": "u8", "I32": "i32",
              "I16": "i16"}


def crate_dir(name: str) -> tuple[Path, str]:
    lock = (ROOT / "Cargo.lock").read_text()
    version = re.search(r'name = "' + re.escape(name) + r'"\nversion = "([^"]+)"', lock).group(1)
    hits = sorted(Path.home().glob(f".cargo/registry/src/*/{name}-{version}"))
    if not hits:
        sys.exit(f"{name} {version} is not in cargo's registry: run `cargo fetch` first")
    return hits[0], version


def fn_body(text: str, name: str, start_at: int = 0) -> str:
    m = re.compile(r"\n    fn " + re.escape(name) + r"\b").search(text, start_at)
    if not m:
        sys.exit(f"metal backend: no method {name} (Candle changed: update metal_table.py)")
    i = text.index("{", text.index(")", m.end()))
    depth, j = 0, i
    while True:
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j + 1]
        j += 1


ARM = re.compile(r"^\s*(\(?[^=\n]*DType::[A-Z0-9]+[^=\n]*?\)?)\s*=>\s*([^\n]+?),?\s*$", re.M)


def arms(body: str):
    """(keys, kernel) for every arm that names a kernel: keys are the pattern's parts (dtypes as f32..., kernel
    names without quotes, enum variants' last segment)."""
    out = []
    for pat, rhs in ARM.findall(body):
        if "bail" in rhs or "Err(" in rhs or "return" in rhs or "set(self" in rhs:
            continue
        keys = []
        for part in re.findall(r'"[^"]*"|DType::[A-Z0-9]+|[A-Za-z]+::[A-Za-z]+', pat):
            if part.startswith('"'):
                keys.append(part.strip('"'))
            elif part.startswith("DType::"):
                keys.append(DTYPE.get(part[7:], part[7:].lower()))
            else:
                keys.append(part.split("::")[1])
        out.append((keys, rhs))
    return out


def branches(body: str) -> dict:
    """{"c": [...keys], "x": [...keys]}: keys joined by ',' (e.g. "Sum,f32", "f32,bf16", "uexp,f16")."""
    table = {"c": set(), "x": set()}
    for keys, rhs in arms(body):
        table["x" if "strided" in rhs else "c"].add(",".join(keys))
    return {k: sorted(v) for k, v in table.items()}


def refuses_strided(body: str) -> bool:
    """Whether a Metal forward bails on a non-contiguous input (`if !(... is_contiguous() ...) { bail!(...) }`)."""
    return bool(re.search(r"if !\(?[^{]*is_contiguous\(\)[^{]*\{\s*(?:candle::|crate::)?bail!", body))


def main() -> None:
    core, core_v = crate_dir("candle-core")
    kernels, kernels_v = crate_dir("candle-metal-kernels")
    nn, nn_v = crate_dir("candle-nn")
    backend = (core / "src/metal_backend/mod.rs").read_text()
    impl_at = backend.index("impl BackendStorage for MetalStorage")
    ops: dict = {}

    for name in ("affine", "powf", "elu", "to_dtype", "unary_impl"):
        ops[name] = branches(fn_body(backend, name, impl_at))
    # const_set's inner `set` names its kernels as contiguous::/strided::const_set paths, one per dtype.
    body = fn_body(backend, "const_set", impl_at)
    ops["const_set"] = {
        "c": sorted({PATH_DTYPE[m] for m in re.findall(r"contiguous::const_set::([A-Z0-9]+)", body)}),
        "x": sorted({PATH_DTYPE[m] for m in re.findall(r"strided::const_set::([A-Z0-9]+)", body)}),
    }
    reduce = branches(fn_body(backend, "reduce_op", impl_at))
    ops["reduce_op"] = reduce
    ops["where_cond"] = branches(fn_body(backend, "where_cond", impl_at))["c"]
    for name in ("gather", "scatter_set", "scatter_add_set", "index_select", "index_add"):
        ops[name] = sorted(set(sum(branches(fn_body(backend, name, impl_at)).values(), [])))
    mm = fn_body(backend, "matmul", impl_at)
    ops["matmul"] = sorted(DTYPE[d] for d in re.findall(r"DType::([A-Z0-9]+) => candle_metal_kernels::GemmDType", mm))
    ops["copy2d"] = sorted({PATH_DTYPE[m] for m in re.findall(r"copy2d::([A-Z0-9]+)", fn_body(backend, "copy2d", impl_at))})
    ops["copy_strided"] = sorted({PATH_DTYPE[m] for m in re.findall(
        r"strided::copy::([A-Z0-9]+)", fn_body(backend, "copy_strided_src", impl_at))})

    # Binary and comparison kernels: names formatted at run time, instantiated in binary.metal.
    metal = (kernels / "src/metal_src/binary.metal").read_text()
    with_bf16 = re.search(r"#if defined\(__HAVE_BFLOAT__\)\n#define init_binary\(bop\)(.*?)#else(.*?)#endif", metal, re.S)
    if not with_bf16:
        sys.exit("binary.metal: init_binary not found (update metal_table.py)")
    bin_dtypes = sorted(set(re.findall(r"init_binary_k\(bop, bop, (\w+),", with_bf16.group(1))))
    bin_no_bf16 = sorted(set(re.findall(r"init_binary_k\(bop, bop, (\w+),", with_bf16.group(2))))
    ops["binary"] = {op: bin_dtypes for op in re.findall(r"^init_binary\((\w+)\);", metal, re.M)}
    cmp_names = re.findall(r"^init_boolean_binary\((\w+), \w+\);", metal, re.M)
    ops["cmp"] = {op: bin_dtypes for op in cmp_names}

    # candle-nn custom ops: name() -> dtypes metal_fwd names kernels for, and whether it refuses strided inputs.
    custom = {}
    for f in ("ops.rs", "rotary_emb.rs"):
        text = (nn / "src" / f).read_text()
        for m in re.finditer(r"impl candle::(CustomOp[123]|InplaceOp[123]) for (\w+)", text):
            end = text.find("\nimpl ", m.end())
            block = text[m.end(): end if end > 0 else len(text)]
            name = re.search(r'fn name\(&self\) -> &\'static str \{\s*"([^"]+)"', block)
            metal = re.search(r"fn metal_fwd(.*?)\n    }\n", block, re.S)
            if not name or not metal:
                continue
            body = metal.group(1)
            dtypes = sorted({DTYPE[d] for d in re.findall(r"DType::([A-Z0-9]+)\b[^\n]*=> (?:\"|contiguous::|strided::)", body)})
            custom[name.group(1)] = {"dtypes": dtypes, "contiguous_only": refuses_strided(body)}
    # candle-core's quantized matmul (QTensor as CustomOp1 "qmatmul"): quantized/metal.rs asserts the activations'
    # dtype and refuses a strided input.
    qmetal = (core / "src/quantized/metal.rs").read_text()
    if '"qmatmul"' not in (core / "src/quantized/mod.rs").read_text():
        sys.exit("quantized/mod.rs: no qmatmul custom op (update metal_table.py)")
    fwd = qmetal[qmetal.index("pub fn fwd("):]
    custom["qmatmul"] = {
        "dtypes": sorted({DTYPE[d] for d in re.findall(r"assert_eq!\(storage\.dtype\(\), DType::([A-Z0-9]+)\)", fwd)}),
        "contiguous_only": refuses_strided(fwd),
    }
    ops["custom"] = custom

    out = {
        "generated_by": "tools/op-recorder/metal_table.py",
        "candle_core": core_v, "candle_metal_kernels": kernels_v, "candle_nn": nn_v,
        "bf16_kernels_need": "Metal 3.1 (macOS 14): binary.metal instantiates bf16 only under __HAVE_BFLOAT__",
        "binary_without_bf16": bin_no_bf16,
        "ops": ops,
    }
    path = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else HERE / f"metal-ops-candle-{core_v}.json"
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(path)


if __name__ == "__main__":
    main()
