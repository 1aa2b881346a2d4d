//! Taking a cache's memory ahead: every page of its buffers touched once,
//! on a thread of its own, so that filling them later costs no page fault
//! (a fresh page cost this machine 1.8 µs: the kernel's fault, its zeroing
//! and its accounting; issue 14, the forty-third session in
//! `bench/README.md`). A data server does it at start, a mount once
//! mounted.
//!
//! The taking stops while too little memory would stay free: an eighth of
//! what the process may use (at least 512 MiB), where what it may use is
//! the host's memory or its memory cgroup's limit, whichever is lower. A
//! cache sized past what there is to spare then takes the rest as blocks
//! fill it, as without this; taken ahead, it would have met the cgroup's
//! out-of-memory killer at start.

use std::path::{Path, PathBuf};

/// Buffers given memory at a time (4 MiB of 64 KiB blocks): a stop waits
/// for one batch at most, and the room is checked again after each.
pub const BATCH: usize = 64;

/// Gives a cache its memory, [`BATCH`] buffers at a time: `take(most)`
/// gives up to `most` buffers theirs ([`crate::Driver::take_memory`]) and
/// returns the bytes taken (0 once every buffer has memory), or `None`
/// once the cache is gone. `what` names the cache in the log. Blocking:
/// call it on a thread of its own. Returns the bytes taken.
pub fn take_ahead(what: &str, mut take: impl FnMut(usize) -> Option<u64>) -> u64 {
    let t = std::time::Instant::now();
    let mut taken = 0;
    loop {
        if let Some(room) = Room::now() {
            if !room.to_take() {
                tracing::warn!(
                    "{what}: took {} MiB of memory ahead, then stopped: {} MiB of {} available{}; the rest is taken as blocks fill the cache",
                    taken >> 20,
                    room.available >> 20,
                    room.total >> 20,
                    if room.cgroup { " in this process's memory cgroup" } else { "" },
                );
                return taken;
            }
        }
        match take(BATCH) {
            None => return taken,
            Some(0) => {
                tracing::info!(
                    "{what}: {} MiB of memory taken ahead in {:.2} s",
                    taken >> 20,
                    t.elapsed().as_secs_f64()
                );
                return taken;
            }
            Some(n) => taken += n,
        }
    }
}

/// Memory this process may still take: the host's, or its memory
/// cgroup's if that is less.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    /// Bytes that may still be taken.
    pub available: u64,
    /// Bytes there are in all.
    pub total: u64,
    /// A memory cgroup's limit is the lower one.
    pub cgroup: bool,
}

impl Room {
    /// Reads `/proc/meminfo` and the process's memory cgroup (v2 and v1).
    /// `None` if the host says nothing of its memory.
    pub fn now() -> Option<Room> {
        let host = std::fs::read_to_string("/proc/meminfo").ok()?;
        let (available, total) = meminfo(&host)?;
        let host = Room {
            available,
            total,
            cgroup: false,
        };
        let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let limits = cgroup_dirs(&cgroups, Path::new("/sys/fs/cgroup"))
            .into_iter()
            .filter_map(|(dir, v2)| cgroup_limit(&dir, v2));
        Some(limits.fold(host, Room::lower))
    }

    /// Whether more may be taken ahead: while an eighth of `total` (at
    /// least 512 MiB) would stay available.
    pub fn to_take(&self) -> bool {
        self.available >= (self.total / 8).max(512 << 20)
    }

    /// The tighter of two rooms: the one with less available.
    fn lower(self, other: (u64, u64)) -> Room {
        let (limit, usage) = other;
        let available = limit.saturating_sub(usage);
        if available < self.available {
            Room {
                available,
                total: limit.min(self.total),
                cgroup: true,
            }
        } else {
            self
        }
    }
}

/// `MemAvailable` and `MemTotal` of `/proc/meminfo`'s text, in bytes.
fn meminfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib = line[name.len()..].trim().trim_end_matches("kB").trim();
        Some(kib.parse::<u64>().ok()? << 10)
    };
    Some((field("MemAvailable:")?, field("MemTotal:")?))
}

/// The directories, under the cgroup file systems' mount `root`, that may
/// hold a limit on this process's memory, from `/proc/self/cgroup`'s text:
/// its own cgroup and each one above it (a parent's limit binds its
/// children too), each with whether it is v2's. A process in a cgroup
/// namespace sees its cgroup as `/`, so the mount's top is included.
fn cgroup_dirs(proc_cgroup: &str, root: &Path) -> Vec<(PathBuf, bool)> {
    let mut dirs = Vec::new();
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (base, v2) = match controllers {
            "" => (root.to_path_buf(), true),
            c if c.split(',').any(|c| c == "memory") => (root.join(c), false),
            _ => continue,
        };
        // A v2 hierarchy mounted beside v1's ("hybrid") sits at `unified`.
        let bases = match v2 {
            true => vec![base.clone(), base.join("unified")],
            false => vec![base],
        };
        for base in bases {
            let mut p = Path::new(path.trim());
            loop {
                let rel = p.strip_prefix("/").unwrap_or(p);
                dirs.push((base.join(rel), v2));
                match p.parent() {
                    Some(up) => p = up,
                    None => break,
                }
            }
        }
    }
    dirs
}

/// A cgroup directory's memory limit and usage in bytes, if it has a
/// limit (v2: `memory.max`, not `max`; v1: `memory.limit_in_bytes`, not
/// the huge number that means none).
fn cgroup_limit(dir: &Path, v2: bool) -> Option<(u64, u64)> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let (limit, usage) = match v2 {
        true => (read("memory.max")?, read("memory.current")?),
        false => (read("memory.limit_in_bytes")?, read("memory.usage_in_bytes")?),
    };
    let limit = limit.trim().parse::<u64>().ok()?;
    // v1 says "no limit" as the largest page-aligned i64.
    if limit >= 1 << 62 {
        return None;
    }
    Some((limit, usage.trim().parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn room_is_the_lower_of_the_host_and_its_cgroup() {
        let host = Room {
            available: 20 * GIB,
            total: 24 * GIB,
            cgroup: false,
        };
        assert!(host.to_take());
        // A cgroup of 1 GiB with 600 MiB used: 424 MiB left, under 512.
        let cg = host.lower((GIB, 600 << 20));
        assert_eq!(
            cg,
            Room {
                available: (1024 - 600) << 20,
                total: GIB,
                cgroup: true
            }
        );
        assert!(!cg.to_take());
        // A limit above what the host has to spare changes nothing.
        assert_eq!(host.lower((64 * GIB, GIB)), host);
        // Usage past the limit (v1 counts the page cache): none left.
        assert_eq!(host.lower((GIB, 2 * GIB)).available, 0);
        // An eighth of a big host must stay free, not only 512 MiB.
        let big = Room {
            available: 30 * GIB,
            total: 256 * GIB,
            cgroup: false,
        };
        assert!(!big.to_take());
    }

    #[test]
    fn this_hosts_room_is_read() {
        let room = Room::now().expect("/proc/meminfo");
        assert!(room.total > 0 && room.available <= room.total, "{room:?}");
        // 8 of 24 GiB, and 3 (an eighth) still; not under it.
        let r = |available| Room {
            available,
            total: 24 * GIB,
            cgroup: false,
        };
        assert!(r(8 * GIB).to_take() && r(3 * GIB).to_take() && !r(3 * GIB - 1).to_take());
    }

    #[test]
    fn meminfo_gives_available_and_total_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:         1000 kB\nMemAvailable:   20480000 kB\n";
        assert_eq!(meminfo(text), Some((20480000 << 10, 24576000 << 10)));
        assert_eq!(meminfo("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn cgroup_dirs_are_the_process_own_and_every_one_above() {
        let root = Path::new("/cg");
        let v1 = "9:name=systemd:/\n4:memory:/jobs/a\n3:cpuset:/\n";
        let dirs = cgroup_dirs(v1, root);
        assert_eq!(
            dirs,
            vec![
                (PathBuf::from("/cg/memory/jobs/a"), false),
                (PathBuf::from("/cg/memory/jobs"), false),
                (PathBuf::from("/cg/memory/"), false),
            ]
        );
        let v2 = "0::/user.slice/job\n";
        let dirs: Vec<_> = cgroup_dirs(v2, root).into_iter().map(|(d, _)| d).collect();
        assert!(dirs.contains(&PathBuf::from("/cg/user.slice/job")));
        assert!(dirs.contains(&PathBuf::from("/cg/user.slice")));
        assert!(dirs.contains(&PathBuf::from("/cg/unified/user.slice/job")));
        // Controllers listed together ("cpu,memory") count.
        assert_eq!(cgroup_dirs("5:cpu,memory:/\n", root).len(), 1);
        assert!(cgroup_dirs("garbage\n", root).is_empty());
    }

    #[test]
    fn a_cgroup_limit_is_read_and_no_limit_is_none() {
        let dir = std::env::temp_dir().join(format!("pc-cgroup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.max"), "max\n").unwrap();
        std::fs::write(dir.join("memory.current"), "4096\n").unwrap();
        assert_eq!(cgroup_limit(&dir, true), None);
        std::fs::write(dir.join("memory.max"), "1073741824\n").unwrap();
        assert_eq!(cgroup_limit(&dir, true), Some((GIB, 4096)));
        std::fs::write(dir.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        std::fs::write(dir.join("memory.usage_in_bytes"), "100\n").unwrap();
        assert_eq!(cgroup_limit(&dir, false), None);
        std::fs::write(dir.join("memory.limit_in_bytes"), "536870912\n").unwrap();
        assert_eq!(cgroup_limit(&dir, false), Some((512 << 20, 100)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
