//! Sums computed by the leader over the rendezvous connections: every other rank sends its values, the leader adds
//! them in rank order (in f64, rounded once to f32) and sends the sums back, so every rank holds the same bits. The
//! data-parallel backend for the CPU and for GPU builds without NCCL; a gradient bucket of a LoRA run is a few
//! megabytes, which a local connection moves in milliseconds.
//!
//! Wire format (little-endian): a tag byte, a u64 count, then that many f32. A rank that ends normally sends the
//! goodbye byte (see rendezvous.rs) where a tag would be.

use super::rendezvous::{Links, GOODBYE};
use super::RankSpec;
use crate::engine::{Error, Result};
use std::io::{Read, Write};
use std::net::TcpStream;

/// The tag of a message of values.
const VALUES: u8 = 0x01;

/// Sum `values` over all ranks; every rank gets the sums.
pub fn all_reduce(links: &mut Links, spec: &RankSpec, values: Vec<f32>) -> Result<Vec<f32>> {
    if spec.world_size == 1 {
        return Ok(values);
    }
    match spec.is_leader() {
        true => lead(links, values),
        false => follow(links, values),
    }
}

fn lead(links: &mut Links, values: Vec<f32>) -> Result<Vec<f32>> {
    let mut sums: Vec<f64> = values.iter().map(|&v| v as f64).collect();
    for index in 0..links.peers.len() {
        let peer = links.peers[index].0;
        let theirs = read_values(&mut links.peers[index].1).map_err(|how| links.peer_lost(peer, &how))?;
        if theirs.len() != sums.len() {
            return Err(Error::Distributed(format!(
                "rank {peer} sent {} gradient values but rank 0 has {}: the ranks train different adapters (run \
                 every rank with the same settings)",
                theirs.len(),
                sums.len()
            )));
        }
        sums.iter_mut().zip(theirs).for_each(|(s, v)| *s += v as f64);
    }
    let sums: Vec<f32> = sums.into_iter().map(|s| s as f32).collect();
    for index in 0..links.peers.len() {
        let peer = links.peers[index].0;
        write_values(&mut links.peers[index].1, &sums).map_err(|how| links.peer_lost(peer, &how))?;
    }
    Ok(sums)
}

fn follow(links: &mut Links, values: Vec<f32>) -> Result<Vec<f32>> {
    let stream = &mut links.peers[0].1;
    let exchanged = write_values(stream, &values).and_then(|()| read_values(stream));
    let sums = exchanged.map_err(|how| links.peer_lost(0, &how))?;
    if sums.len() != values.len() {
        return Err(Error::Distributed(format!("rank 0 sent {} sums for {} values", sums.len(), values.len())));
    }
    Ok(sums)
}

fn write_values(stream: &mut TcpStream, values: &[f32]) -> std::result::Result<(), String> {
    let mut bytes = Vec::with_capacity(9 + values.len() * 4);
    bytes.push(VALUES);
    bytes.extend_from_slice(&(values.len() as u64).to_le_bytes());
    values.iter().for_each(|v| bytes.extend_from_slice(&v.to_le_bytes()));
    stream.write_all(&bytes).map_err(|e| format!("its connection failed ({e})"))
}

fn read_values(stream: &mut TcpStream) -> std::result::Result<Vec<f32>, String> {
    let closed = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => "its connection closed".to_string(),
        _ => format!("its connection failed ({e})"),
    };
    let mut tag = [0u8; 1];
    stream.read_exact(&mut tag).map_err(closed)?;
    match tag[0] {
        VALUES => {}
        GOODBYE => {
            return Err("it ended its run while this rank was still training (the ranks disagree on the run's \
                        length)"
                .into())
        }
        other => return Err(format!("it sent a message this rank does not know (tag {other})")),
    }
    let mut count = [0u8; 8];
    stream.read_exact(&mut count).map_err(closed)?;
    let n = u64::from_le_bytes(count) as usize;
    if n > (1 << 32) {
        return Err(format!("it sent a count of {n} values, which no gradient bucket has"));
    }
    let mut bytes = vec![0u8; n * 4];
    stream.read_exact(&mut bytes).map_err(closed)?;
    Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}
