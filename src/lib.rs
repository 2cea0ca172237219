//! metal-candle: LoRA fine-tuning of language models on your own machine, on Candle.
//!
//! `engine` is the ML engine (models, generation, LoRA, training); `worker` is the one bridge between the
//! engine and its front ends; `cli` and (with the `studio` feature) `studio` consume the same event stream;
//! `stop_signals` turns SIGINT/SIGTERM into a clean stop for both.

pub mod cli;
pub mod engine;
pub mod stop_signals;
#[cfg(feature = "studio")]
pub mod studio;
pub mod worker;

/// The system allocator with per-thread budgets for untrusted code (see `engine::memory_budget`).
#[global_allocator]
static ALLOCATOR: engine::memory_budget::BudgetedAlloc = engine::memory_budget::BudgetedAlloc;
