//! Data-parallel training over several processes, one per device (the way torchrun, SLURM and PyTorch DDP run it).
//!
//! Every process ("rank") holds the whole base model and a replica of the adapters and runs its share of each
//! step's rows ([`RankSpec::shard`]); the adapter gradients and the step's loss are summed over all ranks before
//! the one optimizer update ([`StepSum`]: with NCCL, layer by layer while the backward runs, see
//! train/layer_sums.rs), so every replica applies the same update to the
//! same weights and they stay equal, step after step. The loss of a step is normalised by the whole step's target
//! tokens, so a run on N ranks computes what one device computes on the same global batch.
//!
//! The ranks find each other through a TCP rendezvous at the leader's address (rank 0, `MASTER_ADDR:MASTER_PORT`:
//! see [`rendezvous`]). On CUDA built with the `nccl` feature the sums go through NCCL, whose unique id the leader
//! hands out in the rendezvous; elsewhere (the CPU, a GPU build without NCCL) the leader sums what the others send
//! it over the rendezvous connections and sends the sums back ([`host_sum`]). The rendezvous connections stay open
//! as a heartbeat: a rank that dies closes them, and the others end with an error that names it ([`watchdog`])
//! instead of waiting forever in a collective.
//!
//! Only the leader writes the run folder; the others train without a record and stop when it stops. Starting the
//! processes on one host is [`launch`]'s job.

mod host_sum;
pub mod launch;
mod rendezvous;
mod step_sum;
pub use step_sum::StepSum;
mod watchdog;

use crate::engine::{Error, Result};
use candle_core::Device;
use std::ops::Range;
use std::time::Duration;

/// This process's place in a data-parallel run: its rank among `world_size` processes, its device on this host,
/// and where the leader (rank 0) listens for the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankSpec {
    pub rank: usize,
    pub world_size: usize,
    /// The device ordinal on this host (`LOCAL_RANK`): CUDA device `cuda:LOCAL_RANK`.
    pub local_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// Sum on the host over TCP even on CUDA (a host without NCCL; ranks sharing one GPU, which NCCL refuses).
    pub host_sums: bool,
}

/// The variables torchrun, SLURM's launchers and our own [`launch`] set for each process.
pub const ENV_VARS: [&str; 5] = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"];

/// Set by torchrun when its agent serves a store on `MASTER_PORT` itself (then the rendezvous uses the next port).
pub const AGENT_STORE: &str = "TORCHELASTIC_USE_AGENT_STORE";

impl RankSpec {
    /// The spec the launcher's variables describe, read through `var` (the front end passes the environment; the
    /// engine reads none). None when `WORLD_SIZE` is unset; an error names a variable that is missing or wrong.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let Some(world) = var("WORLD_SIZE") else { return Ok(None) };
        let number = |name: &str, value: Option<String>| -> Result<usize> {
            let value = value.ok_or_else(|| {
                Error::Distributed(format!("WORLD_SIZE is set ({world}) but {name} is not; set all of {ENV_VARS:?}"))
            })?;
            value.trim().parse().map_err(|_| Error::Distributed(format!("{name} is `{value}`, not a number")))
        };
        let world_size = number("WORLD_SIZE", Some(world.clone()))?;
        let rank = number("RANK", var("RANK"))?;
        // LOCAL_RANK defaults to RANK (one host); MASTER_ADDR to this host.
        let local_rank = match var("LOCAL_RANK") {
            Some(v) => number("LOCAL_RANK", Some(v))?,
            None => rank,
        };
        let master_addr = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        let mut port = number("MASTER_PORT", var("MASTER_PORT"))?;
        // torchrun's agent may already serve its own store on MASTER_PORT (it says so with this variable): the
        // rendezvous takes the next port then.
        if var(AGENT_STORE).is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            port += 1;
        }
        let master_port = u16::try_from(port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| Error::Distributed(format!("MASTER_PORT is {port}, not a TCP port (1-65535)")))?;
        let spec = Self { rank, world_size, local_rank, master_addr, master_port, host_sums: false };
        spec.check()?;
        Ok(Some(spec))
    }

    /// Refuse a rank outside the world, or an empty world.
    pub fn check(&self) -> Result<()> {
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(Error::Distributed(format!(
                "RANK is {} but WORLD_SIZE is {}: a rank must be in 0..WORLD_SIZE",
                self.rank, self.world_size
            )));
        }
        Ok(())
    }

    /// Rank 0: the one that writes the run folder and holds the rendezvous.
    pub fn is_leader(&self) -> bool {
        self.rank == 0
    }

    /// Which of `n` rows (in order) this rank trains on: contiguous, as even as can be, the first ranks taking one
    /// more when `n` does not divide (possibly none, when `n` is smaller than the world).
    pub fn shard(&self, n: usize) -> Range<usize> {
        shard_of(n, self.rank, self.world_size)
    }

    /// `host:port` of the leader.
    pub fn master(&self) -> String {
        format!("{}:{}", self.master_addr, self.master_port)
    }
}

/// Rows `rank` of `world` takes of `n` (see [`RankSpec::shard`]).
pub fn shard_of(n: usize, rank: usize, world: usize) -> Range<usize> {
    let (each, extra) = (n / world, n % world);
    let start = rank * each + rank.min(extra);
    start..start + each + usize::from(rank < extra)
}

/// How long the ranks wait for each other to join (loading a large model on a busy host takes minutes).
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(900);

/// How the sums are computed.
enum Summer {
    /// The leader sums over the rendezvous connections.
    Host,
    #[cfg(feature = "nccl")]
    Nccl(crate::engine::ops::cuda::nccl::NcclComm),
}

/// The live group of a data-parallel run, as one rank sees it.
pub struct Group {
    spec: RankSpec,
    summer: Summer,
    links: rendezvous::Links,
    /// Watches the connections while NCCL owns the traffic (the host sums see a dead peer themselves).
    _watchdog: Option<watchdog::Watchdog>,
}

impl Group {
    /// Join the run `spec` describes, with this rank's model on `device`: meet the other ranks at the leader
    /// (waiting up to `timeout` for all of them), agree on how to sum, and set that up. Every rank must call it.
    pub fn join(spec: &RankSpec, device: &Device, timeout: Duration) -> Result<Self> {
        spec.check()?;
        let kind = backend_for(device, spec.host_sums);
        let nccl_id = match (spec.is_leader(), kind) {
            (true, rendezvous::Backend::Nccl) => nccl_unique_id()?,
            _ => [0u8; rendezvous::ID_BYTES],
        };
        let (links, agreed) = rendezvous::meet(spec, kind, nccl_id, timeout)?;
        let summer = match agreed.backend {
            rendezvous::Backend::Host => Summer::Host,
            rendezvous::Backend::Nccl => nccl_summer(spec, device, agreed.nccl_id)?,
        };
        let watchdog = match &summer {
            Summer::Host => None,
            #[cfg(feature = "nccl")]
            Summer::Nccl(comm) => {
                let handle = comm.abort_handle();
                Some(watchdog::Watchdog::start(&links, move || handle.abort())?)
            }
        };
        Ok(Self { spec: spec.clone(), summer, links, _watchdog: watchdog })
    }

    pub fn spec(&self) -> &RankSpec {
        &self.spec
    }

    /// What sums the gradients, for the run's notes.
    pub fn describe(&self) -> String {
        let how = match &self.summer {
            Summer::Host => "summed by rank 0 over TCP",
            #[cfg(feature = "nccl")]
            Summer::Nccl(_) => "summed with NCCL",
        };
        format!(
            "data-parallel over {} processes (this is rank {}); gradients {how}",
            self.spec.world_size, self.spec.rank
        )
    }

    /// `error`, or, when a rank of the run is known to be gone (which is why the work failed), the error naming it.
    pub fn explain(&self, error: Error) -> Error {
        self.links.explain(error)
    }

    /// Tell the others this rank ends normally (a closed connection without it reads as a death).
    pub fn finish(mut self) {
        self.links.say_goodbye();
    }
}

/// What this rank's device can sum with.
fn backend_for(device: &Device, host_sums: bool) -> rendezvous::Backend {
    match device {
        Device::Cuda(_) if cfg!(feature = "nccl") && !host_sums => rendezvous::Backend::Nccl,
        _ => rendezvous::Backend::Host,
    }
}

fn nccl_unique_id() -> Result<[u8; rendezvous::ID_BYTES]> {
    #[cfg(feature = "nccl")]
    return crate::engine::ops::cuda::nccl::NcclComm::unique_id();
    #[cfg(not(feature = "nccl"))]
    Err(Error::Distributed("this binary was built without the `nccl` feature".into()))
}

#[allow(unused_variables)]
fn nccl_summer(spec: &RankSpec, device: &Device, id: [u8; rendezvous::ID_BYTES]) -> Result<Summer> {
    #[cfg(feature = "nccl")]
    return Ok(Summer::Nccl(crate::engine::ops::cuda::nccl::NcclComm::init(device, spec.rank, spec.world_size, id)?));
    #[cfg(not(feature = "nccl"))]
    Err(Error::Distributed("the ranks agreed on NCCL but this binary was built without the `nccl` feature".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_row_once_in_order() {
        for n in 0..12 {
            for world in 1..5 {
                let ranges: Vec<_> = (0..world).map(|r| shard_of(n, r, world)).collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[world - 1].end, n);
                for pair in ranges.windows(2) {
                    assert_eq!(pair[0].end, pair[1].start);
                    assert!(pair[0].len() >= pair[1].len() && pair[0].len() <= pair[1].len() + 1);
                }
            }
        }
    }

    #[test]
    fn launcher_variables_are_read_and_checked() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(name, _)| *name == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(RankSpec::from_vars(vars(&[])).unwrap(), None);
        let spec = RankSpec::from_vars(vars(&[("WORLD_SIZE", "2"), ("RANK", "1"), ("MASTER_PORT", "29500")]))
            .unwrap()
            .unwrap();
        assert_eq!((spec.rank, spec.local_rank, spec.master()), (1, 1, "127.0.0.1:29500".to_string()));
        let bad = RankSpec::from_vars(vars(&[("WORLD_SIZE", "2"), ("RANK", "2"), ("MASTER_PORT", "1")]));
        assert!(bad.unwrap_err().to_string().contains("RANK is 2 but WORLD_SIZE is 2"));
        let missing = RankSpec::from_vars(vars(&[("WORLD_SIZE", "2"), ("RANK", "0")]));
        assert!(missing.unwrap_err().to_string().contains("MASTER_PORT is not"));
    }
}
