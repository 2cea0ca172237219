"""The published chat templates of the phi3, smollm3, granite and olmo2 families, as data for
scripts/make_fixtures.py (the tiny fixtures render them with transformers and our renderer must match).

Each is the text the model's hub repository ships (tokenizer_config.json `chat_template` or
chat_template.jinja); the comment above each names where this copy was taken from.
"""

# microsoft/Phi-4-mini-instruct tokenizer_config.json `chat_template` (phi3 model_type). Tools ride on the
# system message as a `tools` string, so the template stays simple. Same text in guidance-ai's chat template
# table (citing the hub file, L104), onnxruntime-genai's chat template test and the BFCL Phi-4-mini handler.
PHI4_MINI_CHAT_TEMPLATE = "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}"

# HuggingFaceTB/SmolLM3-3B chat_template.jinja as released (July 2025): reasoning modes (/think, /no_think,
# `enable_thinking`), xml/python tools, a `{% generation %}` block and the date from `strftime_now`. Copied
# from johnmai-dev/Jinja Tests/Templates/ChatTemplates.swift (`smollm3`, a raw string), whose tests render the
# hub file and this copy to the same text. The hub's later revision also accepts `tools=` as an alias of
# `xml_tools`; without tools both render the same.
SMOLLM3_CHAT_TEMPLATE = (
    '{# ───── defaults ───── #}\n'
    '{%- if enable_thinking is not defined -%}\n'
    '{%- set enable_thinking = true -%}\n'
    '{%- endif -%}\n'
    '\n'
    '{# ───── reasoning mode ───── #}\n'
    '{%- if enable_thinking -%}\n'
    '{%- set reasoning_mode = "/think" -%}\n'
    '{%- else -%}\n'
    '{%- set reasoning_mode = "/no_think" -%}\n'
    '{%- endif -%}\n'
    '\n'
    '{# ───── header (system message) ───── #}\n'
    '{{- "<|im_start|>system\\n" -}}\n'
    '\n'
    '{%- if messages[0].role == "system" -%}\n'
    '{%- set system_message = messages[0].content -%}\n'
    '{%- if "/no_think" in system_message -%}\n'
    '{%- set reasoning_mode = "/no_think" -%}\n'
    '{%- elif "/think" in system_message -%}\n'
    '{%- set reasoning_mode = "/think" -%}\n'
    '{%- endif -%}\n'
    '{%- set custom_instructions = system_message.replace("/no_think", "").replace("/think", "").rstrip() -%}\n'
    '{%- endif -%}\n'
    '\n'
    '{%- if "/system_override" in system_message -%}\n'
    '{{- custom_instructions.replace("/system_override", "").rstrip() -}}\n'
    '{{- "<|im_end|>\\n" -}}\n'
    '{%- else -%}\n'
    '{{- "## Metadata\\n\\n" -}}\n'
    '{{- "Knowledge Cutoff Date: June 2025\\n" -}}\n'
    '{%- set today = strftime_now("%d %B %Y") -%}\n'
    '{{- "Today Date: " ~ today ~ "\\n" -}}\n'
    '{{- "Reasoning Mode: " + reasoning_mode + "\\n\\n" -}}\n'
    '\n'
    '{{- "## Custom Instructions\\n\\n" -}}\n'
    '{%- if custom_instructions -%}\n'
    '{{- custom_instructions + "\\n\\n" -}}\n'
    '{%- elif reasoning_mode == "/think" -%}\n'
    '{{- "You are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role as an assistant involves thoroughly exploring questions through a systematic thinking process before providing the final precise and accurate solutions. This requires engaging in a comprehensive cycle of analysis, summarizing, exploration, reassessment, reflection, backtracking, and iteration to develop well-considered thinking process. Please structure your response into two main sections: Thought and Solution using the specified format: <think> Thought section </think> Solution section. In the Thought section, detail your reasoning process in steps. Each step should include detailed considerations such as analysing questions, summarizing relevant findings, brainstorming new ideas, verifying the accuracy of the current steps, refining any errors, and revisiting previous steps. In the Solution section, based on various attempts, explorations, and reflections from the Thought section, systematically present the final solution that you deem correct. The Solution section should be logical, accurate, and concise and detail necessary steps needed to reach the conclusion.\\n\\n" -}}\n'
    '{%- else -%}\n'
    '{{- "You are a helpful AI assistant named SmolLM, trained by Hugging Face.\\n\\n" -}}\n'
    '{%- endif -%}\n'
    '\n'
    '{%- if xml_tools or python_tools -%}\n'
    '{{- "### Tools\\n\\n" -}}\n'
    '{%- if xml_tools -%}\n'
    '  {%- set ns = namespace(xml_tool_string="You may call one or more functions to assist with the user query.\\nYou are provided with function signatures within <tools></tools> XML tags:\\n\\n<tools>\\n") -%}\n'
    '  {%- for tool in xml_tools[:] -%} {# The slicing makes sure that xml_tools is a list #}\n'
    '    {%- set ns.xml_tool_string = ns.xml_tool_string ~ (tool | string) ~ "\\n" -%}\n'
    '  {%- endfor -%}\n'
    '  {%- set xml_tool_string = ns.xml_tool_string + "</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>" -%}\n'
    '  {{- xml_tool_string -}}\n'
    '{%- endif -%}\n'
    '{%- if python_tools -%}\n'
    '  {%- set ns = namespace(python_tool_string="When you send a message containing Python code between \'<code>\' and \'</code>\' tags, it will be executed in a stateful Jupyter notebook environment, and you will then be given the output to continued reasoning in an agentic loop.\\n\\nYou can use the following tools in your python code like regular functions:\\n<tools>\\n") -%}\n'
    '  {%- for tool in python_tools[:] -%} {# The slicing makes sure that python_tools is a list #}\n'
    '    {%- set ns.python_tool_string = ns.python_tool_string ~ (tool | string) ~ "\\n" -%}\n'
    '  {%- endfor -%}\n'
    '  {%- set python_tool_string = ns.python_tool_string + "</tools>\\n\\nThe state persists between code executions: so variables that you define in one step are still available thereafter." -%}\n'
    '  {{- python_tool_string -}}\n'
    '{%- endif -%}\n'
    '{{- "\\n\\n" -}}\n'
    '{{- "<|im_end|>\\n" -}}\n'
    '{%- endif -%}\n'
    '{%- endif -%}\n'
    '{# ───── main loop ───── #}\n'
    '{%- for message in messages -%}\n'
    '{%- set content = message.content if message.content is string else "" -%}\n'
    '{%- if message.role == "user" -%}\n'
    '    {{ "<|im_start|>" + message.role + "\\n"  + content + "<|im_end|>\\n" }}\n'
    '{%- elif message.role == "assistant" -%}\n'
    '    {% generation %}\n'
    '    {%- if reasoning_mode == "/think" -%}\n'
    '        {{ "<|im_start|>assistant\\n" + content.lstrip("\\n") + "<|im_end|>\\n" }}\n'
    '    {%- else -%}\n'
    '        {{ "<|im_start|>assistant\\n" + "<think>\\n\\n</think>\\n" + content.lstrip("\\n") + "<|im_end|>\\n" }}\n'
    '    {%- endif -%}\n'
    '    {% endgeneration %}\n'
    '{%- elif message.role == "tool" -%}\n'
    '{{ "<|im_start|>" + "user\\n"  + content + "<|im_end|>\\n" }}\n'
    '{%- endif -%}\n'
    '{%- endfor -%}\n'
    '{# ───── generation prompt ───── #}\n'
    '{%- if add_generation_prompt -%}\n'
    '{%- if reasoning_mode == "/think" -%}\n'
    '    {{ "<|im_start|>assistant\\n" }}\n'
    '{%- else -%}\n'
    '    {{ "<|im_start|>assistant\\n" + "<think>\\n\\n</think>\\n"  }}\n'
    '{%- endif -%}\n'
    '{%- endif -%}'
)

# ibm-granite/granite-3.3-*-instruct tokenizer_config.json `chat_template`: default system prompt with
# "Today's Date" from `strftime_now`, tools, documents, `thinking` and `controls`. Copied from
# johnmai-dev/Jinja Tests/Templates/ChatTemplates.swift (`granite3_3`, Swift escapes undone).
GRANITE33_CHAT_TEMPLATE = (
    '{# Alias tools -> available_tools #}\n'
    '{%- if tools and not available_tools -%}\n'
    '    {%- set available_tools = tools -%}\n'
    '{%- endif -%}\n'
    "{%- if messages[0]['role'] == 'system' %}\n"
    "     {%- set system_message = messages[0]['content'] %}\n"
    '     {%- set loop_messages = messages[1:] %}\n'
    ' {%- else %}\n'
    '     {%- set system_message = "Knowledge Cutoff Date: April 2024.\\nToday\'s Date: " + strftime_now(\'%B %d, %Y\') + ".\\nYou are Granite, developed by IBM." %}\n'
    '     {%- if available_tools and documents %}\n'
    '         {%- set system_message = system_message + " You are a helpful assistant with access to the following tools. When a tool is required to answer the user\'s query, respond only with <|tool_call|> followed by a JSON list of tools used. If a tool does not exist in the provided list of tools, notify the user that you do not have the ability to fulfill the request.\\nWrite the response to the user\'s input by strictly aligning with the facts in the provided documents. If the information needed to answer the question is not available in the documents, inform the user that the question cannot be answered based on the available data." %}\n'
    '     {%- elif available_tools %}\n'
    '         {%- set system_message = system_message + " You are a helpful assistant with access to the following tools. When a tool is required to answer the user\'s query, respond only with <|tool_call|> followed by a JSON list of tools used. If a tool does not exist in the provided list of tools, notify the user that you do not have the ability to fulfill the request." %}\n'
    '     {%- elif documents %}\n'
    '         {%- set system_message = system_message + " Write the response to the user\'s input by strictly aligning with the facts in the provided documents. If the information needed to answer the question is not available in the documents, inform the user that the question cannot be answered based on the available data." %}\n'
    '    {%- elif thinking %}\n'
    '    {%- set system_message = system_message + " You are a helpful AI assistant.\\nRespond to every user query in a comprehensive and detailed way. You can write down your thoughts and reasoning process before responding. In the thought process, engage in a comprehensive cycle of analysis, summarization, exploration, reassessment, reflection, backtracing, and iteration to develop well-considered thinking process. In the response section, based on various attempts, explorations, and reflections from the thoughts section, systematically present the final solution that you deem correct. The response should summarize the thought process. Write your thoughts between <think></think> and write your response between <response></response> for each user query." %}\n'
    '     {%- else %}\n'
    '         {%- set system_message = system_message + " You are a helpful AI assistant." %}\n'
    '     {%- endif %}\n'
    "     {%- if 'citations' in controls and documents %}\n"
    "         {%- set system_message = system_message + '\\nUse the symbols <|start_of_cite|> and <|end_of_cite|> to indicate when a fact comes from a document in the search result, e.g <|start_of_cite|> {document_id: 1}my fact <|end_of_cite|> for a fact from document 1. Afterwards, list all the citations with their corresponding documents in an ordered list.' %}\n"
    '     {%- endif %}\n'
    "     {%- if 'hallucinations' in controls and documents %}\n"
    "         {%- set system_message = system_message + '\\nFinally, after the response is written, include a numbered list of sentences from the response with a corresponding risk value that are hallucinated and not based in the documents.' %}\n"
    '     {%- endif %}\n'
    '     {%- set loop_messages = messages %}\n'
    ' {%- endif %}\n'
    " {{- '<|start_of_role|>system<|end_of_role|>' + system_message + '<|end_of_text|>\\n' }}\n"
    ' {%- if available_tools %}\n'
    "     {{- '<|start_of_role|>available_tools<|end_of_role|>' }}\n"
    '     {{- available_tools | tojson(indent=4) }}\n'
    "     {{- '<|end_of_text|>\\n' }}\n"
    ' {%- endif %}\n'
    ' {%- if documents %}\n'
    '     {%- for document in documents %}\n'
    '         {{- \'<|start_of_role|>document {"document_id": "\' + document[\'doc_id\'] | string + \'"}<|end_of_role|>\\n\' }}\n'
    "         {{- document['text'] }}\n"
    "         {{- '<|end_of_text|>\\n' }}\n"
    '              {%- endfor %}\n'
    ' {%- endif %}\n'
    ' {%- for message in loop_messages %}\n'
    "     {{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + message['content'] + '<|end_of_text|>\\n' }}\n"
    '     {%- if loop.last and add_generation_prompt %}\n'
    "         {{- '<|start_of_role|>assistant' }}\n"
    '             {%- if controls %}\n'
    "                 {{- ' ' + controls | tojson()}}\n"
    '             {%- endif %}\n'
    "         {{- '<|end_of_role|>' }}\n"
    '     {%- endif %}\n'
    ' {%- endfor %}'
)

# allenai/OLMo-2-1124-7B-Instruct tokenizer_config.json `chat_template` (the Tulu 3 template with the bos token
# in front); quoted the same in several public repositories that pin it (e.g. Levanter's OLMo-2 config notes
# "OLMo-2's published chat template").
OLMO2_CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'assistant' %}{% if not loop.last %}{{ '<|assistant|>\n'  + message['content'] + eos_token + '\n' }}{% else %}{{ '<|assistant|>\n'  + message['content'] + eos_token }}{% endif %}{% endif %}{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}{% endfor %}"
