//! The `metal-candle` binary: no subcommand opens the studio; subcommands run the same engine headless.

use clap::Parser;

// Training allocates and frees many activation-sized buffers per step; mimalloc reuses them instead of
// returning pages to the OS and faulting them back in (a large share of CPU step time with glibc malloc).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // Before any thread starts: it may set OPENBLAS_CORETYPE for the library it loads.
    metal_candle::engine::blas::init();
    let cli = metal_candle::cli::Cli::parse();
    if let Err(err) = metal_candle::cli::run(cli) {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}
