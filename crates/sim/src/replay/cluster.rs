//! The modelled cluster a trace replays on: how many data servers, how
//! files are striped, how big the caches are, and what messages, disks and
//! copies cost. The defaults describe parcache on loopback on a 2-core
//! machine like the one it is developed on; `parcache sim
//! calibrate-cluster` measures this machine and writes a file with the
//! same keys, which `--cluster FILE` reads.

use parcache_core::WritePolicyKind;
use serde::{Deserialize, Serialize};

/// Block size of the node caches and the data servers' caches (parcache's
/// 64 KiB, `NodeCacheConfig` and `IOD_BLOCK`).
pub const BLOCK: u32 = 64 << 10;

/// The cluster's parts and costs. Every field has a default; a TOML file
/// may set any of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterModel {
    /// Nodes to fold the trace's nodes onto (node i runs on i mod N); 0
    /// keeps one modelled node per traced node.
    pub nodes: usize,
    /// Data servers.
    pub servers: usize,
    /// Bytes per stripe unit (a multiple of the 64 KiB block).
    pub stripe_unit: u64,
    /// Each node's cache.
    pub node_cache_mib: u64,
    /// Each data server's cache.
    pub server_cache_mib: u64,
    /// The data servers' write policy (parcache's default, `threshold`).
    pub server_write: String,
    /// One-way latency of a message between a node and a server.
    pub latency_us: f64,
    /// Each data server's network bandwidth (MB/s, both directions shared).
    pub link_mbps: f64,
    /// Each data server's disk bandwidth (MB/s).
    pub disk_mbps: f64,
    /// A disk request that does not follow the previous one costs this
    /// much more.
    pub disk_seek_us: f64,
    /// What a data server's durable log adds to each write it takes.
    pub log_write_us: f64,
    /// Copies between a cache and a program (GB/s).
    pub memcpy_gbps: f64,
    /// What each operation costs at the node before any data moves (the
    /// system call, the mount, the client).
    pub op_us: f64,
    /// The metadata server's service time per request.
    pub meta_us: f64,
    /// Prefetches each node keeps in flight at most.
    pub prefetch_depth: usize,
}

impl Default for ClusterModel {
    fn default() -> Self {
        ClusterModel {
            nodes: 0,
            servers: 4,
            stripe_unit: 64 << 10,
            node_cache_mib: 64,
            server_cache_mib: 256,
            server_write: WritePolicyKind::THRESHOLD_DEFAULT.to_string(),
            latency_us: 40.0,
            link_mbps: 1500.0,
            disk_mbps: 400.0,
            disk_seek_us: 100.0,
            log_write_us: 30.0,
            memcpy_gbps: 4.0,
            op_us: 15.0,
            meta_us: 40.0,
            prefetch_depth: 4,
        }
    }
}

impl ClusterModel {
    /// Reads a TOML file of settings (missing keys keep their defaults).
    pub fn from_toml(text: &str) -> Result<ClusterModel, String> {
        let m: ClusterModel = toml::from_str(text).map_err(|e| e.to_string())?;
        m.check()?;
        Ok(m)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a cluster model serialises")
    }

    /// Refuses settings no cluster has, naming the key.
    pub fn check(&self) -> Result<(), String> {
        let positive = [
            ("link_mbps", self.link_mbps),
            ("disk_mbps", self.disk_mbps),
            ("memcpy_gbps", self.memcpy_gbps),
        ];
        for (k, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{k} = {v}: must be a positive number"));
            }
        }
        let costs = [
            ("latency_us", self.latency_us),
            ("disk_seek_us", self.disk_seek_us),
            ("log_write_us", self.log_write_us),
            ("op_us", self.op_us),
            ("meta_us", self.meta_us),
        ];
        for (k, v) in costs {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{k} = {v}: must be a time ≥ 0"));
            }
        }
        if self.servers == 0 {
            return Err("servers = 0: a cluster needs a data server".into());
        }
        if self.stripe_unit == 0 || !self.stripe_unit.is_multiple_of(BLOCK as u64) {
            return Err(format!(
                "stripe_unit = {}: must be a multiple of the {} KiB block",
                self.stripe_unit,
                BLOCK >> 10
            ));
        }
        if self.node_cache_mib == 0 || self.server_cache_mib == 0 {
            return Err("node_cache_mib and server_cache_mib must be at least 1".into());
        }
        self.server_write_policy()?;
        Ok(())
    }

    pub fn server_write_policy(&self) -> Result<WritePolicyKind, String> {
        self.server_write
            .parse()
            .map_err(|e| format!("server_write = {:?}: {e}", self.server_write))
    }

    /// Buffers of `mib` MiB of 64 KiB blocks.
    pub fn buffers(mib: u64) -> usize {
        ((mib << 20) / BLOCK as u64).max(4) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_sets_what_it_names_and_refuses_the_rest() {
        let m = ClusterModel::from_toml("servers = 2\nlatency_us = 10.0\n").unwrap();
        assert_eq!(m.servers, 2);
        assert_eq!(m.disk_mbps, ClusterModel::default().disk_mbps);
        assert_eq!(ClusterModel::from_toml(&m.to_toml()).unwrap(), m);
        let e = ClusterModel::from_toml("servrs = 2\n").unwrap_err();
        assert!(e.contains("servrs"), "{e}");
        let e = ClusterModel::from_toml("stripe_unit = 1000\n").unwrap_err();
        assert!(e.contains("stripe_unit"), "{e}");
        let e = ClusterModel::from_toml("server_write = \"sometimes\"\n").unwrap_err();
        assert!(e.contains("server_write"), "{e}");
        let e = ClusterModel::from_toml("disk_mbps = 0.0\n").unwrap_err();
        assert!(e.contains("disk_mbps"), "{e}");
    }
}
