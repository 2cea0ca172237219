//! The tests' stand-in for the Hugging Face Hub as a program, for the Python interop check
//! (`scripts/check_hub_interop.py`), the download benchmark and studio screenshots:
//!
//! ```sh
//! cargo run --release --example hub_server -- --model org/tiny=tests/fixtures/tiny-llama \
//!     --dataset org/chat=assets/sample-chat [--gated org/tiny --token hf_x] [--delay-ms 5] [--port 8999]
//! ```
//! Prints `listening on http://127.0.0.1:PORT` and serves until killed.

#[path = "../tests/common/hub_server.rs"]
mod hub_server;

use hub_server::{FakeRepo, HubServer};
use std::path::Path;
use std::sync::atomic::Ordering;

fn main() {
    let mut repos = Vec::new();
    let mut token = None;
    let mut gated = Vec::new();
    let mut port = 0u16;
    let mut delay_ms = 0u64;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--model" | "--dataset" => {
                let spec = value();
                let (id, dir) = spec.split_once('=').expect("ORG/NAME=FOLDER");
                let collection = if flag == "--model" { "models" } else { "datasets" };
                let mut repo = FakeRepo::from_dir(collection, id, Path::new(dir));
                repo.downloads = 1000 - repos.len() as u64;
                repos.push(repo);
            }
            "--gated" => gated.push(value()),
            "--token" => token = Some(value()),
            "--port" => port = value().parse().expect("--port N"),
            "--delay-ms" => delay_ms = value().parse().expect("--delay-ms N"),
            other => panic!("unknown flag {other}"),
        }
    }
    for repo in &mut repos {
        repo.gated = gated.contains(&repo.id);
    }
    let server = HubServer::start_on(repos, token.as_deref(), port);
    server.faults.chunk_delay_ms.store(delay_ms, Ordering::Relaxed);
    println!("listening on {}", server.url);
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
