//! `--format ollama`: a folder Ollama imports with `ollama create NAME -f Modelfile`: the merged GGUF export
//! (`model.gguf`) and a `Modelfile` with `FROM ./model.gguf`, a `TEMPLATE` in Ollama's Go template language
//! equivalent to the model's chat template, a `SYSTEM` line when the chat template inserts a default system
//! prompt, and one `PARAMETER stop` for every end-of-turn token.
//!
//! The template is recognised by its markers: ChatML (`<|im_start|>`: SmolLM2, Qwen), SmolLM3's ChatML with its
//! metadata system block, Llama 3 (`<|start_header_id|>`), Mistral (`[INST]`), Gemma 3 (`<start_of_turn>`; the
//! system prompt opens the first user turn), Granite (`<|start_of_role|>`), Phi-3 / Phi-4-mini (`<|end|>` and
//! `<|assistant|>`) and OLMo 2 (`<|user|>` and `<|assistant|>`, no `<|end|>`). Any other chat template gets no `TEMPLATE` line (Ollama then
//! falls back to the GGUF's own `tokenizer.chat_template` handling) and the Modelfile says so. Ollama passes
//! system messages in `.Messages` as well as in `.System`; the new templates read `.System` only.

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

const GEMMA3: &str = "{{- $first := true }}{{- range $i, $_ := .Messages }}{{- $last := eq (len (slice $.Messages $i)) 1 }}\
{{- if eq .Role \"user\" }}<start_of_turn>user\n{{ if and $first $.System }}{{ $.System }}\n\n{{ end }}{{ $first = false }}\
{{ .Content }}<end_of_turn>\n{{ if $last }}<start_of_turn>model\n{{ end }}\
{{- else if eq .Role \"assistant\" }}<start_of_turn>model\n{{ .Content }}<end_of_turn>\n{{ end }}{{- end }}";

const PHI: &str = "{{- if .System }}<|system|>{{ .System }}<|end|>{{ end }}{{- range .Messages }}\
{{- if eq .Role \"user\" }}<|user|>{{ .Content }}<|end|>\
{{- else if eq .Role \"assistant\" }}<|assistant|>{{ .Content }}<|end|>{{ end }}{{- end }}<|assistant|>";

const GRANITE: &str = "{{- if .System }}<|start_of_role|>system<|end_of_role|>{{ .System }}<|end_of_text|>\n{{ end }}\
{{- range .Messages }}{{- if ne .Role \"system\" }}<|start_of_role|>{{ .Role }}<|end_of_role|>{{ .Content }}<|end_of_text|>\n\
{{ end }}{{- end }}<|start_of_role|>assistant<|end_of_role|>";

/// `{eos}` is the model's end-of-sequence token, which OLMo 2's template appends to assistant turns.
const OLMO2: &str = "{{- if .System }}<|system|>\n{{ .System }}\n{{ end }}{{- range .Messages }}\
{{- if eq .Role \"user\" }}<|user|>\n{{ .Content }}\n\
{{ else if eq .Role \"assistant\" }}<|assistant|>\n{{ .Content }}{eos}\n{{ end }}{{- end }}<|assistant|>\n";

/// SmolLM3's system block (its chat template also writes today's date there, which a Go template cannot).
const SMOLLM3: &str = "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nReasoning Mode: /think\n\n\
## Custom Instructions\n\n{{ .System }}\n\n{{ range .Messages }}{{ if ne .Role \"system\" }}<|im_start|>{{ .Role }}\n\
{{ .Content }}<|im_end|>\n{{ end }}{{ end }}<|im_start|>assistant\n";

/// A chat template family we translate: how its Jinja source is recognised (every marker present), its Ollama
/// template, its end-of-turn token ("" when that is the model's eos), and where its rendering puts a default
/// system prompt (between the two strings), if it has one.
struct Family {
    markers: &'static [&'static str],
    template: &'static str,
    end_of_turn: &'static str,
    default_system: Option<(&'static str, &'static str)>,
}

/// In recognition order: SmolLM3's ChatML before plain ChatML.
const FAMILIES: [Family; 8] = [
    Family {
        markers: &["<|im_start|>", "Reasoning Mode"],
        template: SMOLLM3,
        end_of_turn: "<|im_end|>",
        default_system: Some(("## Custom Instructions\n\n", "\n\n<|im_start|>user")),
    },
    Family {
        markers: &["<|im_start|>"],
        template: CHATML,
        end_of_turn: "<|im_end|>",
        default_system: Some(("<|im_start|>system\n", "<|im_end|>")),
    },
    Family { markers: &["<|start_header_id|>"], template: LLAMA3, end_of_turn: "<|eot_id|>", default_system: None },
    Family { markers: &["[INST]"], template: MISTRAL, end_of_turn: "</s>", default_system: None },
    Family { markers: &["<start_of_turn>"], template: GEMMA3, end_of_turn: "<end_of_turn>", default_system: None },
    Family {
        markers: &["<|start_of_role|>"],
        template: GRANITE,
        end_of_turn: "<|end_of_text|>",
        default_system: Some(("<|start_of_role|>system<|end_of_role|>", "<|end_of_text|>")),
    },
    // Phi-4-mini's template builds `<|user|>` from the role name: its fixed pieces are the markers.
    Family { markers: &["<|end|>", "<|assistant|>"], template: PHI, end_of_turn: "<|end|>", default_system: None },
    Family { markers: &["<|user|>", "<|assistant|>"], template: OLMO2, end_of_turn: "", default_system: None },
];

/// The Modelfile text for `model` (whose GGUF sits next to it as [`OLLAMA_GGUF`]).
pub fn modelfile(model: &ModelInfo) -> Result<String> {
    let source = model.chat_template.as_ref().map(|t| t.source.as_str()).unwrap_or("");
    let family = FAMILIES.iter().find(|f| f.markers.iter().all(|m| source.contains(m)));
    let eos = model.eos_token_ids.first().and_then(|id| model.tokenizer.id_to_token(*id)).unwrap_or_default();
    let mut text = format!("FROM ./{OLLAMA_GGUF}\n");
    match family {
        Some(f) => text.push_str(&format!("TEMPLATE \"\"\"{}\"\"\"\n", f.template.replace("{eos}", &eos))),
        None => text.push_str(
            "# no TEMPLATE: this chat template is not one we translate (ChatML, SmolLM3, Llama 3, Mistral, Gemma 3, \
             Granite, Phi-3/Phi-4, OLMo 2)\n",
        ),
    }
    if let Some(system) = default_system_prompt(model, family.and_then(|f| f.default_system))? {
        text.push_str(&format!("SYSTEM \"\"\"{system}\"\"\"\n"));
    }
    for stop in stop_tokens(model, family.map(|f| f.end_of_turn).filter(|t| !t.is_empty())) {
        text.push_str(&format!("PARAMETER stop \"{}\"\n", stop.replace('\\', "\\\\").replace('"', "\\\"")));
    }
    Ok(text)
}

/// The system prompt the chat template inserts when the conversation has none (SmolLM2, SmolLM3 and Granite
/// do): what its rendering of one user turn holds between the family's two markers.
fn default_system_prompt(model: &ModelInfo, markers: Option<(&str, &str)>) -> Result<Option<String>> {
    let Some((open, close)) = markers else { return Ok(None) };
    const USER: &str = "metal-candle-user-turn";
    let rendered = model.render_chat(&[ChatMessage::new("user", USER)], true)?;
    let Some((before, rest)) = rendered.split_once(open) else { return Ok(None) };
    // Only a block before the user's turn is a default system prompt.
    let system = rest.split_once(close).map(|(system, _)| system.to_string());
    Ok(system.filter(|s| !before.contains(USER) && !s.contains(USER)))
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
