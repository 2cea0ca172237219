// llama.cpp's prefill and decode speed on the CPU, through node-llama-cpp's prebuilt binaries: the other side of
// `metal-candle bench generate --json`, measured the same way. Prints one JSON line in the same shape.
//
//   node bench_decode.mjs MODEL.gguf [--threads 2] [--prompt-tokens 128] [--new-tokens 64] [--repeats 3]
//
// The prompt is the same deterministic text as ours (src/engine/bench.rs, `synthetic_prompt`), tokenized by the
// file's tokenizer without special tokens and repeated to exactly P tokens. One warm-up run of 4 tokens, then R
// runs from an empty KV cache, each: prefill the P prompt tokens and sample the first token (prefill time),
// then greedy-decode one token at a time until M tokens are out (decode time, M - 1 tokens). Best of the R runs,
// as ours reports. Model and context load are outside the timings.
import {getLlama} from "node-llama-cpp";

const args = process.argv.slice(2);
const modelPath = args[0];
const opt = (name, dflt) => {
    const at = args.indexOf(`--${name}`);
    return at > 0 ? Number(args[at + 1]) : dflt;
};
const threads = opt("threads", 2);
const promptTokens = opt("prompt-tokens", 128);
const newTokens = opt("new-tokens", 64);
const repeats = Math.max(1, opt("repeats", 3));
if (!modelPath) {
    console.error("usage: node bench_decode.mjs MODEL.gguf [--threads N] [--prompt-tokens P] [--new-tokens M] [--repeats R]");
    process.exit(2);
}

const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const context = await model.createContext({
    contextSize: Math.max(512, promptTokens + newTokens + 8),
    batchSize: Math.max(512, promptTokens),
    threads,
});
const sequence = context.getSequence();

const text = "The quick brown fox jumps over the lazy dog while the curious cat watches from the window. ";
const piece = Array.from(model.tokenize(text, false));
const prompt = [];
while (prompt.length < promptTokens) prompt.push(...piece);
prompt.length = promptTokens;

/** One run from an empty cache: [prefill secs, decode secs, tokens out]. */
async function run(count) {
    await sequence.clearHistory();
    const start = process.hrtime.bigint();
    let firstAt = start;
    let out = 0;
    // temperature 0: argmax (greedy); the generator evaluates each sampled token to get the next one.
    for await (const _token of sequence.evaluate(prompt, {temperature: 0})) {
        out += 1;
        if (out === 1) firstAt = process.hrtime.bigint();
        if (out >= count) break;
    }
    const end = process.hrtime.bigint();
    return [Number(firstAt - start) / 1e9, Number(end - firstAt) / 1e9, out];
}

await run(Math.min(4, newTokens));
let prefill = 0;
let decode = 0;
for (let i = 0; i < repeats; i++) {
    const [prefillSecs, decodeSecs, out] = await run(newTokens);
    prefill = Math.max(prefill, promptTokens / Math.max(prefillSecs, 1e-9));
    decode = Math.max(decode, Math.max(out - 1, 0) / Math.max(decodeSecs, 1e-9));
}
console.log(JSON.stringify({
    decode_tokens_per_sec: decode,
    device: "cpu",
    dtype: "gguf",
    impl: "llama.cpp",
    new_tokens: newTokens,
    prefill_tokens_per_sec: prefill,
    prompt_tokens: promptTokens,
    repeats,
    threads,
}));
process.exit(0);
