//! Unit tests of preference tokenization and batching (tokenizers: the byte tokenizer of `tokenize`'s tests,
//! and tiny-llama's real one).
