// llama.cpp as the oracle for metal-candle's GGUF exports, through node-llama-cpp's prebuilt CPU binaries.
// Prints one JSON object on stdout.
//
//   node oracle.mjs greedy   MODEL.gguf '[ids]' N [--lora ADAPTER.gguf]   -> {"generated_ids": [...]}
//   node oracle.mjs logprobs MODEL.gguf '[ids]'   [--lora ADAPTER.gguf]   -> {"token_logprobs": [...], "nll_mean": x}
//   node oracle.mjs gap      MODEL.gguf '[ids]' '[a, b]'                  -> {"logit_a", "logit_b", "max"}
//   node oracle.mjs tokenize MODEL.gguf TEXT                               -> {"ids": [...]}  (special tokens parsed, BOS as the file says)
//   node oracle.mjs tokenize-many MODEL.gguf TEXTS.json                    -> {"ids": [[...], ...]}  (the same, for a JSON list of texts)
//   node oracle.mjs chat     MODEL.gguf QUESTION N                         -> {"text", "stop_reason", "template"}
//        (one user turn through the file's own `tokenizer.chat_template` (JinjaTemplateChatWrapper), greedy, at most
//         N tokens; stop_reason "eogToken" means it ended its turn, "maxTokens" that it ran into the limit)
//
// `includeMax` alone does not bring the largest logit into a filtered map; `includeTop: 1` does.
// Greedy means temperature 0 (argmax); the prompt is given as token ids so both sides see the same input.
import {getLlama, LlamaChatSession, JinjaTemplateChatWrapper} from "node-llama-cpp";

const [mode, modelPath, arg, n, ...rest] = process.argv.slice(2);
const loraAt = process.argv.indexOf("--lora");
const lora = loraAt > 0 ? process.argv[loraAt + 1] : undefined;

const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath});

function tokenizeAsTheFileSays(text) {
    const ids = model.tokenize(text, true);
    const bos = model.tokens.bos;
    const addBos = model.tokens.shouldPrependBosToken;
    return addBos && bos != null ? [bos, ...ids] : Array.from(ids);
}

if (mode === "tokenize") {
    console.log(JSON.stringify({ids: tokenizeAsTheFileSays(arg)}));
    process.exit(0);
}

if (mode === "tokenize-many") {
    const fs = await import("node:fs");
    const texts = JSON.parse(fs.readFileSync(arg, "utf8"));
    console.log(JSON.stringify({ids: texts.map(tokenizeAsTheFileSays)}));
    process.exit(0);
}

if (mode === "chat") {
    const template = model.fileInfo.metadata?.tokenizer?.chat_template;
    if (!template) {
        console.error("the file has no tokenizer.chat_template");
        process.exit(2);
    }
    const context = await model.createContext({contextSize: 512, batchSize: 512, threads: 2});
    const session = new LlamaChatSession({
        contextSequence: context.getSequence(),
        chatWrapper: new JinjaTemplateChatWrapper({template}),
    });
    const res = await session.promptWithMeta(arg, {maxTokens: Number(n), temperature: 0});
    console.log(JSON.stringify({text: res.responseText, stop_reason: res.stopReason, template: "tokenizer.chat_template"}));
    process.exit(0);
}

const ids = JSON.parse(arg);
const context = await model.createContext({
    contextSize: 512,
    batchSize: 512,
    threads: 2,
    ...(lora ? {lora: {adapters: [{filePath: lora, scale: 1}]}} : {}),
});
const sequence = context.getSequence();

if (mode === "greedy") {
    const out = [];
    const count = Number(n);
    for await (const token of sequence.evaluate(ids, {temperature: 0})) {
        out.push(token);
        if (out.length >= count) break;
    }
    console.log(JSON.stringify({generated_ids: out}));
} else if (mode === "logprobs") {
    // log p(ids[i+1] | ids[..=i]) = logit - max logit - log(sum exp(logit - max logit))
    const input = ids.slice(0, -1).map((token, i) => [
        token,
        {generateNext: {logits: {filter: {tokens: [ids[i + 1]], includeMax: true, includeTop: 1}}, totalLogitWeight: true}},
    ]);
    const res = await sequence.controlledEvaluate(input);
    const lps = res.map((r, i) => {
        const logits = r.next.logits;
        const max = Math.max(...logits.values());
        return logits.get(ids[i + 1]) - max - Math.log(r.next.totalLogitWeight);
    });
    console.log(JSON.stringify({token_logprobs: lps, nll_mean: -lps.reduce((a, b) => a + b, 0) / lps.length}));
} else if (mode === "gap") {
    // logits of two candidate tokens after the prefix: how close a greedy disagreement was
    const [a, b] = JSON.parse(n);
    const res = await sequence.controlledEvaluate([
        ...ids.slice(0, -1),
        [ids[ids.length - 1], {generateNext: {logits: {filter: {tokens: [a, b], includeMax: true, includeTop: 1}}}}],
    ]);
    const logits = res[res.length - 1].next.logits;
    console.log(JSON.stringify({logit_a: logits.get(a), logit_b: logits.get(b), max: Math.max(...logits.values())}));
} else {
    console.error(`unknown mode ${mode}`);
    process.exit(2);
}
