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
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
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

impl Drop for BenchCluster {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
