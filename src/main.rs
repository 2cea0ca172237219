//! The `metal-candle` binary: no subcommand opens the studio; subcommands run the same engine headless.

use clap::Parser;

/// Training allocates and frees hundreds of activation-sized buffers per step. By default glibc serves
/// those with fresh `mmap`s and trims freed memory back to the OS, so every step faults in and zeroes
/// gigabytes of pages (we measured the kernel's page clearing at 25-40% of CPU step time). Keep freed
/// memory in the heap for reuse instead.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory_for_reuse() {
    extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_TOP_PAD: i32 = -2;
    const M_MMAP_THRESHOLD: i32 = -3;
    // SAFETY: mallopt only tunes the allocator; called before any other thread exists.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 32 << 20);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
        mallopt(M_TOP_PAD, 64 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory_for_reuse() {}

fn main() {
    keep_freed_memory_for_reuse();
    // The engine's runtime options (kernel and BLAS switches) come from the flags and, for older scripts, the
    // METAL_CANDLE_* variables: `cli::run` builds them and hands them to the engine before anything loads.
    let cli = metal_candle::cli::Cli::parse();
    if let Err(err) = metal_candle::cli::run(cli) {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}
