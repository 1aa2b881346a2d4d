//! Helpers shared by the benchmarks.

use anyhow::Result;
use parcache_proto::Secret;
use parcache_server::{iod, mds};
use std::path::Path;

/// A parcache cluster (`iods` data servers and a metadata server) on
/// loopback, on its own tokio runtime, as separate daemons would be: real
/// sockets, the real protocol, the write log fsyncing as in production.
pub struct BenchCluster {
    pub mds_addr: String,
    pub secret: Secret,
    stop: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
    _rt: tokio::runtime::Runtime,
}

impl BenchCluster {
    /// Starts the servers with their data under `dir`.
    pub fn start(dir: &Path, iods: usize) -> Result<BenchCluster> {
        let secret = Secret::generate();
        let rt = parcache_server::runtime()?;
        let mut iod_addrs = vec![];
        for i in 0..iods {
            let mut cfg = iod::IodConfig::new(dir.join(format!("iod-{i}")), "127.0.0.1:0".parse()?, secret.clone());
            cfg.checkpoint_bytes = 256 << 20;
            let r = rt.block_on(iod::start(cfg))?;
            iod_addrs.push(r.addr.to_string());
            rt.spawn(r.served);
        }
        let m = rt.block_on(mds::start(mds::MdsConfig {
            data_dir: dir.join("mds"),
            listen: "127.0.0.1:0".parse()?,
            secret: secret.clone(),
            iods: iod_addrs,
        }))?;
        let mds_addr = m.addr.to_string();
        rt.spawn(m.served);
        Ok(BenchCluster {
            mds_addr,
            secret,
            stop: m.stop,
            _rt: rt,
        })
    }
}

/// Samples this process's thread count (every daemon of a bench cluster,
/// and the client, run in it) until dropped; [`ThreadWatch::most`] is the
/// highest count seen.
pub struct ThreadWatch {
    most: std::sync::Arc<std::sync::atomic::AtomicU32>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ThreadWatch {
    pub fn start() -> ThreadWatch {
        use std::sync::atomic::Ordering;
        let w = ThreadWatch {
            most: Default::default(),
            stop: Default::default(),
        };
        let (most, stop) = (w.most.clone(), w.stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                most.fetch_max(parcache_server::threads_now(), Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        });
        w
    }

    pub fn most(&self) -> u32 {
        self.most.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for ThreadWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for BenchCluster {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Distinct bytes for benchmark files: a xorshift stream from `seed`, so no
/// two 16 KiB chunks of different seeds or offsets are alike (content-
/// addressed stores cannot deduplicate them) and a read is checked cheaply.
pub fn distinct(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}
