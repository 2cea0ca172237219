//! The `metal-candle` binary: no subcommand opens the studio; subcommands run the same engine headless.

use clap::Parser;

fn main() {
    let cli = metal_candle::cli::Cli::parse();
    if let Err(err) = metal_candle::cli::run(cli) {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}
