"""Unsloth + TRL's SFTTrainer on a text dataset, packed (TRL's bfd packing, padding-free) or not: non-padding tokens
per second over the timed steps, for scripts/bench_packing_gpu.sh. LoRA r8 alpha 16 on all seven linears, bf16, AdamW
lr 2e-4 constant, no checkpointing; the model folder is ../shared/anchors/gpu_unsloth.py's (random weights, byte-level
tokenizer). Tokens are counted as the collator hands them to the model (attention_mask ones, or every id when the batch
is padding-free), timed from the end of warm-up step WARM to the last step.
Usage: bench_trl_packing.py MODEL DATA.jsonl SEQ_LEN BATCH packed|padded STEPS WARM"""
import json, os, sys, time
for k, v in dict(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", UNSLOTH_DISABLE_STATISTICS="1",
                 UNSLOTH_COMPILE_LOCATION="/tmp/unsloth_compiled_cache").items():
    os.environ.setdefault(k, v)
from unsloth import FastLanguageModel
import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer

model_dir, data, seq_len, batch, mode, steps, warm = sys.argv[1:8]
seq_len, batch, steps, warm = int(seq_len), int(batch), int(steps), int(warm)
rows = [json.loads(l) for l in open(data)]
model, tok = FastLanguageModel.from_pretrained(model_dir, max_seq_length=seq_len, dtype=torch.bfloat16,
                                               load_in_4bit=False, use_gradient_checkpointing=False)
model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, lora_dropout=0, use_gradient_checkpointing=False,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
args = SFTConfig(output_dir="/tmp/trl-packing", max_steps=steps, per_device_train_batch_size=batch, learning_rate=2e-4,
                 lr_scheduler_type="constant", warmup_steps=0, logging_steps=1, save_strategy="no", report_to=[],
                 bf16=True, optim="adamw_torch", max_length=seq_len, packing=mode == "packed",
                 dataset_text_field="text", dataloader_num_workers=0, seed=0)
trainer = SFTTrainer(model=model, processing_class=tok, train_dataset=Dataset.from_list(rows), args=args)
tokens, stamps = [], []
collate = trainer.data_collator
def counting(features):
    out = collate(features)
    mask = out.get("attention_mask")
    tokens.append(int(mask.sum()) if mask is not None else int(out["input_ids"].numel()))
    return out
trainer.data_collator = counting
class Clock(TrainerCallback):
    def on_step_end(self, *a, **k):
        torch.cuda.synchronize(); stamps.append(time.perf_counter())
trainer.add_callback(Clock())
torch.cuda.reset_peak_memory_stats()
trainer.train()
timed = sum(tokens[warm:len(stamps)])
secs = stamps[-1] - stamps[warm - 1]
gaps = sorted(b - a for a, b in zip(stamps[warm - 1:], stamps[warm:]))
print(json.dumps(dict(impl=f"unsloth+trl {mode}", seq_len=seq_len, batch=batch, steps=len(stamps) - warm,
                      median_step_s=round(gaps[len(gaps) // 2], 4), attention=model.config._attn_implementation,
                      real_tokens_per_s=round(timed / secs), mean_tokens_per_step=round(timed / (len(stamps) - warm)),
                      peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2))))
