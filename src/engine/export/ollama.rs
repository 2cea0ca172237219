//! `--format ollama`: a folder Ollama imports with `ollama create NAME -f Modelfile`: the merged GGUF export
//! (`model.gguf`) and a `Modelfile` with `FROM ./model.gguf`, a `TEMPLATE` in Ollama's Go template language
//! equivalent to the model's chat template, a `SYSTEM` line when the chat template inserts a default system
//! prompt, and one `PARAMETER stop` for every end-of-turn token.
//!
//! The template is recognised by its markers: ChatML (`<|im_start|>`: SmolLM2, Qwen), Llama 3
//! (`<|start_header_id|>`) and Mistral (`[INST]`). Any other chat template gets no `TEMPLATE` line (Ollama then
//! falls back to the GGUF's own `tokenizer.chat_template` handling) and the Modelfile says so.

use crate::engine::model::chat_template::ChatMessage;
use crate::engine::model::ModelInfo;
use crate::engine::Result;

/// The file name of the GGUF inside the Ollama folder.
pub const OLLAMA_GGUF: &str = "model.gguf";

const CHATML: &str = r#"{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}{{- range .Messages }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}<|im_start|>assistant
"#;

const LLAMA3: &str = r#"{{- if .System }}<|start_header_id|>system<|end_header_id|>

{{ .System }}<|eot_id|>{{ end }}{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>

{{ .Content }}<|eot_id|>{{ end }}<|start_header_id|>assistant<|end_header_id|>

"#;

const MISTRAL: &str = r#"{{- range $i, $_ := .Messages }}{{- if eq .Role "user" }}[INST] {{ if and $.System (eq (len (slice $.Messages $i)) 1) }}{{ $.System }}

{{ end }}{{ .Content }}[/INST]{{ else if eq .Role "assistant" }} {{ .Content }}</s>{{ end }}{{- end }}"#;

/// The chat template families we translate: (marker, Ollama template, end-of-turn token).
const FAMILIES: [(&str, &str, &str); 3] = [
    ("<|im_start|>", CHATML, "<|im_end|>"),
    ("<|start_header_id|>", LLAMA3, "<|eot_id|>"),
    ("[INST]", MISTRAL, "</s>"),
];

/// The Modelfile text for `model` (whose GGUF sits next to it as [`OLLAMA_GGUF`]).
pub fn modelfile(model: &ModelInfo) -> Result<String> {
    let source = model.chat_template.as_ref().map(|t| t.source.as_str()).unwrap_or("");
    let family = FAMILIES.iter().find(|(marker, _, _)| source.contains(marker));
    let mut text = format!("FROM ./{OLLAMA_GGUF}\n");
    match family {
        Some((_, template, _)) => text.push_str(&format!("TEMPLATE \"\"\"{template}\"\"\"\n")),
        None => text.push_str("# no TEMPLATE: this chat template is not one we translate (ChatML, Llama 3, Mistral)\n"),
    }
    if let Some(system) = default_system_prompt(model, family.is_some_and(|(m, _, _)| *m == "<|im_start|>"))? {
        text.push_str(&format!("SYSTEM \"\"\"{system}\"\"\"\n"));
    }
    for stop in stop_tokens(model, family.map(|(_, _, eot)| *eot)) {
        text.push_str(&format!("PARAMETER stop \"{}\"\n", stop.replace('\\', "\\\\").replace('"', "\\\"")));
    }
    Ok(text)
}

/// The system prompt a ChatML template inserts when the conversation has none (SmolLM2 does).
fn default_system_prompt(model: &ModelInfo, chatml: bool) -> Result<Option<String>> {
    if !chatml {
        return Ok(None);
    }
    let rendered = model.render_chat(&[ChatMessage::new("user", "x")], true)?;
    let Some(rest) = rendered.strip_prefix("<|im_start|>system\n") else { return Ok(None) };
    Ok(rest.split_once("<|im_end|>").map(|(system, _)| system.to_string()))
}

/// Every end-of-generation token as text, the family's end-of-turn token first, without repeats.
fn stop_tokens(model: &ModelInfo, end_of_turn: Option<&str>) -> Vec<String> {
    let mut stops: Vec<String> =
        end_of_turn.filter(|t| model.tokenizer.token_to_id(t).is_some()).map(str::to_owned).into_iter().collect();
    for id in &model.eos_token_ids {
        if let Some(token) = model.tokenizer.id_to_token(*id) {
            if !stops.contains(&token) {
                stops.push(token);
            }
        }
    }
    stops
}
