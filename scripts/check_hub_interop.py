#!/usr/bin/env python3
"""The real huggingface_hub client against metal-candle's Hugging Face cache, both ways (run by tests/hub_interop.rs
against the local Hub stand-in; HF_ENDPOINT names it).

  check_hub_interop.py read-ours CACHE REPO SNAPSHOT   huggingface_hub finds our download offline (local_files_only),
                                                       scan_cache_dir sees no problem, transformers (if installed)
                                                       loads the model offline
  check_hub_interop.py download CACHE REPO             huggingface_hub downloads REPO into CACHE; prints the folder
  check_hub_interop.py peft-base CACHE CHECKPOINT      PEFT (if installed) loads our adapter with the base its
                                                       base_model_name_or_path names, from CACHE offline

Prints one JSON object on stdout.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import huggingface_hub as hf  # noqa: E402


def read_ours(cache, repo, snapshot):
    out = {"huggingface_hub": hf.__version__}
    path = hf.snapshot_download(repo, cache_dir=cache, local_files_only=True)
    out["snapshot"] = path
    out["same_snapshot"] = os.path.realpath(path) == os.path.realpath(snapshot)
    config = hf.hf_hub_download(repo, "config.json", cache_dir=cache, local_files_only=True)
    out["config_found"] = os.path.isfile(config)
    out["try_to_load_from_cache"] = hf.try_to_load_from_cache(repo, "model.safetensors", cache_dir=cache)
    report = hf.scan_cache_dir(cache)
    out["scan_warnings"] = [str(w) for w in report.warnings]
    out["scan_repos"] = sorted(r.repo_id for r in report.repos)
    sizes = {r.repo_id: r.size_on_disk for r in report.repos}
    out["scan_size"] = sizes.get(repo)
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError:
        out["transformers"] = None
        return out
    os.environ["HF_HUB_OFFLINE"] = "1"
    model = transformers.AutoModelForCausalLM.from_pretrained(repo, cache_dir=cache, local_files_only=True)
    tok = transformers.AutoTokenizer.from_pretrained(repo, cache_dir=cache, local_files_only=True)
    out["transformers"] = {"version": transformers.__version__, "model_type": model.config.model_type,
                           "vocab": len(tok)}
    return out


def download(cache, repo):
    path = hf.snapshot_download(repo, cache_dir=cache)
    return {"huggingface_hub": hf.__version__, "snapshot": path}


def peft_base(cache, checkpoint):
    try:
        import peft
        import torch  # noqa: F401
    except ImportError:
        return {"peft": None}
    os.environ["HF_HUB_OFFLINE"] = "1"
    model = peft.AutoPeftModelForCausalLM.from_pretrained(checkpoint, cache_dir=cache, local_files_only=True)
    return {"peft": peft.__version__, "base": model.peft_config["default"].base_model_name_or_path,
            "model_type": model.base_model.model.config.model_type}


def main():
    mode = sys.argv[1]
    if mode == "read-ours":
        result = read_ours(*sys.argv[2:5])
    elif mode == "peft-base":
        result = peft_base(*sys.argv[2:4])
    elif mode == "download":
        result = download(*sys.argv[2:4])
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
