# The second call of the packing benchmark (bench_packing_gpu.sh): Unsloth's own loop on full 4 x 2048 rows (the most
# packing could give it), the library versions, and the Unsloth + TRL packed run again with its step time and attention.
#   G=.gpu/pk OUT=... bash scripts/bench_trl_packing_diag.sh
set -u
G=${G:-.gpu/pk}; O=$OUT/diag.log
mkdir -p /tmp/site && tar -xJf $G/unsloth-site.tar.xz -C /tmp/site
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 UNSLOTH_DISABLE_STATISTICS=1
python3 scripts/make_packing_data.py /tmp/pk.jsonl >> $O
(cd $G && python3 gpu_unsloth.py llama-1b 4 2048 all bf16 none 2>&1 | grep -v "^\s*$" | tail -3) >> $O
python3 -c "import torch, transformers, trl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)" >> $O 2>&1
python3 -c "import flash_attn" >> $O 2>&1 || echo "no flash_attn" >> $O
python3 scripts/bench_trl_packing.py /tmp/llama-1b-bf16 /tmp/pk.jsonl 2048 4 packed 40 5 > /tmp/trl.out 2> /tmp/trl.err
echo "exit $?" >> $O; tail -1 /tmp/trl.out >> $O
grep -i -E "pack|padding|flash|sdpa|attention|xformers|warn|contamin|position" /tmp/trl.err | sort | uniq -c | sort -rn | head -30 >> $O
