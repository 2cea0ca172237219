//! The rendezvous: every rank but the leader connects to the leader's `MASTER_ADDR:MASTER_PORT` and says who it is
//! (rank, world size, what its device can sum with); once all of them are in, the leader answers each with how the
//! run sums (NCCL with its unique id, or the host) or with why it refuses (a rank twice, a world size or a device
//! kind that disagrees). The connections stay open afterwards: the host sums travel on them, and a connection that
//! closes without a goodbye means its rank died.
//!
//! Wire format (little-endian): hello = `MCDP`, version u32, rank u32, world u32, backend u8; answer = status u8
//! (0: agreed, then backend u8 and the 128-byte NCCL id; 1: refused, then a u32 length and the reason in UTF-8).

use super::RankSpec;
use crate::engine::{Error, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes in an NCCL unique id.
pub const ID_BYTES: usize = 128;
const MAGIC: &[u8; 4] = b"MCDP";
const VERSION: u32 = 1;
/// The one byte a rank sends each peer when it ends normally.
pub(super) const GOODBYE: u8 = 0xEE;

/// How the ranks sum their gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The leader sums over these connections (CPU, or a GPU build without NCCL).
    Host = 0,
    /// NCCL on CUDA.
    Nccl = 1,
}

impl Backend {
    fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(Self::Host),
            1 => Some(Self::Nccl),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Host => "the host (CPU, or a GPU build without NCCL)",
            Self::Nccl => "NCCL (CUDA)",
        }
    }
}

/// What the ranks agreed on.
pub struct Agreed {
    pub backend: Backend,
    pub nccl_id: [u8; ID_BYTES],
}

/// This rank's open connections: the leader's to every other rank, another rank's to the leader.
pub struct Links {
    /// (peer rank, connection), in rank order.
    pub(super) peers: Vec<(usize, TcpStream)>,
    /// Why the run cannot go on, once a peer is known to be gone (set by the watchdog or a failed host sum).
    pub(super) lost: Arc<Mutex<Option<String>>>,
}

impl Links {
    /// `error`, or the reason the run broke when a peer is gone (which is why the collective failed).
    pub fn explain(&self, error: Error) -> Error {
        match (self.lost.lock().ok().and_then(|l| l.clone()), &error) {
            // Already the error that names the lost rank.
            (Some(_), Error::Distributed(_)) | (None, _) => error,
            (Some(reason), _) => Error::Distributed(format!("{reason} (what failed here: {error})")),
        }
    }

    /// Record that `peer` is gone, and return the error that says so.
    pub(super) fn peer_lost(&self, peer: usize, how: &str) -> Error {
        let reason = lost_reason(peer, how);
        if let Ok(mut slot) = self.lost.lock() {
            slot.get_or_insert(reason.clone());
        }
        Error::Distributed(reason)
    }

    pub(super) fn say_goodbye(&mut self) {
        for (_, stream) in &mut self.peers {
            let _ = stream.write_all(&[GOODBYE]);
        }
    }
}

/// The message for a peer that is gone.
pub(super) fn lost_reason(peer: usize, how: &str) -> String {
    format!(
        "rank {peer} stopped: {how}. It died or was killed (its own output says why); the run ends here, and its \
         last saved checkpoint is intact: resume from it"
    )
}

/// Meet the other ranks (see the module docs). The leader listens; the others connect, retrying until it listens.
pub fn meet(spec: &RankSpec, mine: Backend, nccl_id: [u8; ID_BYTES], timeout: Duration) -> Result<(Links, Agreed)> {
    let deadline = Instant::now() + timeout;
    let links = match spec.is_leader() {
        true => lead(spec, mine, nccl_id, deadline)?,
        false => return follow(spec, mine, deadline),
    };
    Ok((links, Agreed { backend: mine, nccl_id }))
}

fn io_error(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::Distributed(format!("{what}: {e}"))
}

fn lead(spec: &RankSpec, mine: Backend, nccl_id: [u8; ID_BYTES], deadline: Instant) -> Result<Links> {
    let master = spec.master();
    let listener = TcpListener::bind(bind_address(spec)?)
        .map_err(io_error(format!("rank 0 cannot listen on {master} (MASTER_ADDR:MASTER_PORT)")))?;
    listener.set_nonblocking(true).map_err(io_error("rank 0's listener".into()))?;
    let mut joined: Vec<(usize, TcpStream, Backend)> = Vec::new();
    while joined.len() + 1 < spec.world_size {
        match listener.accept() {
            Ok((stream, _)) => {
                // A connection that is not a rank of this run (a stray client, a stale rank) is answered and dropped.
                if let Some(rank) = read_hello(stream, spec, &joined, deadline)? {
                    joined.push(rank);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    let missing: Vec<usize> =
                        (1..spec.world_size).filter(|r| !joined.iter().any(|(j, ..)| j == r)).collect();
                    return Err(Error::Distributed(format!(
                        "rank 0 waited for ranks {missing:?} at {master} and they did not come; check that every \
                         rank runs with the same MASTER_ADDR/MASTER_PORT and WORLD_SIZE"
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(io_error(format!("rank 0 accepting on {master}"))(e)),
        }
    }
    joined.sort_by_key(|(rank, ..)| *rank);
    let odd: Vec<String> = joined
        .iter()
        .filter(|(_, _, b)| *b != mine)
        .map(|(r, _, b)| format!("rank {r} sums with {}", b.name()))
        .collect();
    let refusal = (!odd.is_empty()).then(|| {
        format!(
            "rank 0 sums with {} but {}; every rank must run on the same kind of device",
            mine.name(),
            odd.join(", ")
        )
    });
    let mut peers = Vec::new();
    for (rank, mut stream, _) in joined {
        let answer = match &refusal {
            None => [&[0u8, mine as u8][..], &nccl_id[..]].concat(),
            Some(why) => [&[1u8][..], &(why.len() as u32).to_le_bytes(), why.as_bytes()].concat(),
        };
        stream.write_all(&answer).map_err(io_error(format!("rank 0 answering rank {rank}")))?;
        let _ = stream.set_read_timeout(None);
        peers.push((rank, stream));
    }
    if let Some(why) = refusal {
        return Err(Error::Distributed(why));
    }
    Ok(Links { peers, lost: Arc::default() })
}

/// Where the leader listens: MASTER_ADDR itself when it is an address of this host (loopback for one host), else
/// every interface (a host name other machines know this one by).
fn bind_address(spec: &RankSpec) -> Result<std::net::SocketAddr> {
    let resolved = (spec.master_addr.as_str(), spec.master_port)
        .to_socket_addrs()
        .map_err(io_error(format!("MASTER_ADDR `{}` does not resolve", spec.master_addr)))?
        .next()
        .ok_or_else(|| Error::Distributed(format!("MASTER_ADDR `{}` has no address", spec.master_addr)))?;
    match resolved.ip().is_loopback() {
        true => Ok(resolved),
        false => Ok(std::net::SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), spec.master_port)),
    }
}

/// Read one hello: Some((rank, stream, backend)) for a rank of this run, None (after a refusal) for anything else.
fn read_hello(
    mut stream: TcpStream,
    spec: &RankSpec,
    joined: &[(usize, TcpStream, Backend)],
    deadline: Instant,
) -> Result<Option<(usize, TcpStream, Backend)>> {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_nodelay(true);
    let _ =
        stream.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1))));
    let mut hello = [0u8; 17];
    if stream.read_exact(&mut hello).is_err() || &hello[..4] != MAGIC {
        return Ok(None);
    }
    let word = |i: usize| u32::from_le_bytes(hello[i..i + 4].try_into().unwrap_or_default()) as usize;
    let (version, rank, world) = (word(4), word(8), word(12));
    let problem = if version != VERSION as usize {
        Some(format!("rank {rank} speaks rendezvous version {version}, rank 0 {VERSION}: run the same binary"))
    } else if world != spec.world_size {
        Some(format!("rank {rank} says WORLD_SIZE={world} but rank 0 has {}", spec.world_size))
    } else if rank == 0 || rank >= world || joined.iter().any(|(r, ..)| *r == rank) {
        Some(format!("a second process says it is rank {rank} (ranks must be distinct, 1..{world} besides rank 0)"))
    } else {
        None
    };
    let backend = Backend::from_byte(hello[16]);
    match (problem, backend) {
        (None, Some(backend)) => Ok(Some((rank, stream, backend))),
        (problem, _) => {
            let why = problem.unwrap_or_else(|| format!("rank {rank} sent an unknown backend"));
            let _ = stream.write_all(&[&[1u8][..], &(why.len() as u32).to_le_bytes(), why.as_bytes()].concat());
            Err(Error::Distributed(why))
        }
    }
}

fn follow(spec: &RankSpec, mine: Backend, deadline: Instant) -> Result<(Links, Agreed)> {
    let master = spec.master();
    let mut stream = loop {
        match TcpStream::connect(&master) {
            Ok(stream) => break stream,
            Err(e) if Instant::now() > deadline => {
                return Err(Error::Distributed(format!(
                    "rank {} could not reach rank 0 at {master} (MASTER_ADDR:MASTER_PORT): {e}",
                    spec.rank
                )))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let _ = stream.set_nodelay(true);
    let hello = [
        &MAGIC[..],
        &VERSION.to_le_bytes(),
        &(spec.rank as u32).to_le_bytes(),
        &(spec.world_size as u32).to_le_bytes(),
        &[mine as u8],
    ]
    .concat();
    let rank = spec.rank;
    stream.write_all(&hello).map_err(io_error(format!("rank {rank} greeting rank 0")))?;
    let _ =
        stream.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1))));
    let waited = || format!("rank {rank} waiting for rank 0 to gather every rank");
    let mut status = [0u8; 1];
    stream.read_exact(&mut status).map_err(io_error(waited()))?;
    if status[0] != 0 {
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).map_err(io_error(waited()))?;
        let mut why = vec![0u8; u32::from_le_bytes(len).min(1 << 16) as usize];
        stream.read_exact(&mut why).map_err(io_error(waited()))?;
        return Err(Error::Distributed(format!("rank 0 refused rank {rank}: {}", String::from_utf8_lossy(&why))));
    }
    let mut answer = [0u8; 1 + ID_BYTES];
    stream.read_exact(&mut answer).map_err(io_error(waited()))?;
    let backend = Backend::from_byte(answer[0])
        .ok_or_else(|| Error::Distributed(format!("rank 0 answered rank {rank} with an unknown backend")))?;
    let _ = stream.set_read_timeout(None);
    let mut nccl_id = [0u8; ID_BYTES];
    nccl_id.copy_from_slice(&answer[1..]);
    Ok((Links { peers: vec![(0, stream)], lost: Arc::default() }, Agreed { backend, nccl_id }))
}
