//! `parcache mount`: the cluster as a FUSE file system on this node.
//!
//! A mount of a cluster started with `--data DIR` records itself in
//! `DIR/mounts/PID` (its mount point) while it runs, so `parcache down`
//! unmounts every node of the cluster on this host and `status` lists them.

use crate::fs::Target;
use anyhow::{bail, Context, Result};
use clap::Args;
use parcache_fuse::{FuseQueues, Mount};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Args)]
pub struct MountArgs {
    /// Where to mount (an existing, empty directory).
    mountpoint: PathBuf,
    #[command(flatten)]
    target: Target,
    /// Where this node answers the other nodes of the cooperative tier
    /// (files with a `cooperative` policy read blocks from each other's
    /// caches). Port 0 picks a free one; use a routable address when the
    /// nodes are on different hosts.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    peer_bind: String,
    /// MiB of node cache for each combination of policies in use (a pool;
    /// 64 KiB blocks).
    #[arg(long, value_name = "MIB", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    cache_mib: u64,
    /// Let the node cache take its memory as blocks fill it. By default
    /// the mount takes the memory of the pool the root directory's
    /// policies use (--cache-mib) once mounted, in the background, so
    /// that the first blocks it caches pay no page faults on the data
    /// path.
    #[arg(long)]
    lazy_cache: bool,
    /// MiB of this node's share of the global cache (files with
    /// `cooperative=global`, 64 KiB blocks): blocks other nodes read
    /// through it stay here for all.
    #[arg(long, value_name = "MIB", default_value_t = 64, value_parser = clap::value_parser!(u64).range(0..=1 << 20))]
    global_mib: u64,
    /// This node's durable write cache (the client NV cache of Biswas et
    /// al. 1993): a directory on the node's own disk for its log. Writes to
    /// files with `nv=on` are acknowledged once fsynced there, survive a
    /// crash of the mount or the machine, and are delivered at the next
    /// mount with the same directory. Without it, `nv=on` files are written
    /// through to the data servers.
    #[arg(long, value_name = "DIR")]
    nv_dir: Option<PathBuf>,
    /// MiB of the durable write cache (dirty blocks of `nv=on` files it
    /// holds before their write policy must write some down).
    #[arg(long, value_name = "MIB", default_value_t = 8, requires = "nv_dir", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    nv_mib: u64,
    /// Record every open, read, write, fsync and close that reaches the
    /// mount into FILE (parcache's JSONL trace, which `parcache sim replay`
    /// and `parcache advise` read). FILE must not exist yet.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// Take requests over FUSE's io_uring queues where the kernel offers
    /// them (Linux 6.14+, with `enable_uring` of the fuse module set: `echo
    /// Y > /sys/module/fuse/parameters/enable_uring` as root), and warn
    /// where it does not: a request queue per CPU, answered on that CPU,
    /// so a small request's round trip through the mount is several times
    /// shorter. Experimental: on Linux 6.18 a read over the queues was
    /// now and then never handed to the mount under concurrent random
    /// reads, and the program waited for ever. See docs/mount.md, "FUSE
    /// over io_uring".
    #[arg(long, conflicts_with = "no_io_uring")]
    io_uring: bool,
    /// Take every request over /dev/fuse: the default.
    #[arg(long)]
    no_io_uring: bool,
    /// Threads reading requests from /dev/fuse (the first fuser's, the
    /// others on clones of its descriptor, as libfuse's `clone_fd`):
    /// requests from several programs are started at once, and a random
    /// reader's local read blocks only its own thread. 1 reads them one at
    /// a time. Not used over the io_uring queues (a thread per CPU).
    #[arg(long, value_name = "N", default_value_t = parcache_fuse::DEFAULT_READERS as u16,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    fuse_threads: u16,
}

/// What is at a mount point.
#[derive(Debug, PartialEq, Eq)]
pub enum MountState {
    NotMounted,
    /// Mounted and answering.
    Live,
    /// Mounted, but its FUSE process is gone: every access fails with
    /// ENOTCONN until it is unmounted.
    Stale,
}

/// The absolute path of `dir` without touching `dir` itself (a dead mount
/// point cannot be stat'ed, so `canonicalize` fails on it).
pub fn absolute(dir: &Path) -> Option<PathBuf> {
    let abs = std::path::absolute(dir).ok()?;
    match (abs.parent(), abs.file_name()) {
        (Some(p), Some(n)) => Some(p.canonicalize().ok()?.join(n)),
        _ => Some(abs),
    }
}

/// Whether the absolute path `abs` is listed in the mount table.
fn listed(abs: &Path) -> bool {
    // Read as bytes: a mount point that is not UTF-8, here or anywhere
    // on the host, must not hide a mount.
    std::fs::read("/proc/mounts")
        .map(|m| parcache_fuse::mount_table(&m).iter().any(|e| e.at == abs))
        .unwrap_or(false)
}

/// Whether `dir` is a mount point, and whether its file system answers.
pub fn state(dir: &Path) -> MountState {
    let Some(abs) = absolute(dir) else {
        return MountState::NotMounted;
    };
    if !listed(&abs) {
        return MountState::NotMounted;
    }
    // Opening the directory always reaches the mount's process (a `stat`
    // may be answered from the kernel's attributes for a second after it
    // died); the listing is not read.
    match std::fs::read_dir(&abs) {
        Err(e) if e.raw_os_error() == Some(107) => MountState::Stale, // ENOTCONN
        _ => MountState::Live,
    }
}

/// Detaches a mount at once, even if it is dead or busy (`fusermount3 -u -z`).
pub fn lazy_unmount(dir: &Path) -> Result<()> {
    let out = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(dir)
        .output()
        .context("running fusermount3 (scripts/setup.sh installs fuse3)")?;
    if !out.status.success() {
        bail!(
            "fusermount3 -u -z {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A dead mount left at `dir` by a killed mount process is unmounted
/// (lazily), with a word to the user; a live one is an error.
pub fn clear_stale(dir: &Path) -> Result<()> {
    match state(dir) {
        MountState::NotMounted => Ok(()),
        MountState::Live => bail!("{} is already a mount point", dir.display()),
        MountState::Stale => {
            lazy_unmount(dir).with_context(|| {
                format!(
                    "{} is a dead mount (its process was killed); unmount it with `fusermount3 -u -z {}`",
                    dir.display(),
                    dir.display()
                )
            })?;
            eprintln!(
                "parcache: {} was a dead mount (its process was killed): unmounted it",
                dir.display()
            );
            Ok(())
        }
    }
}

/// A mount of a cluster on this host, as recorded in `DIR/mounts/PID`.
pub struct MountRecord {
    pub pid: u32,
    pub at: PathBuf,
    file: PathBuf,
}

impl MountRecord {
    /// Removes the record.
    pub fn forget(self) {
        let _ = std::fs::remove_file(&self.file);
        let _ = std::fs::remove_file(lost_file(&self.file));
    }

    /// What the mount, now ended, could not push at its end (the error it
    /// exited with), if anything: its dirty data was lost with it.
    pub fn lost(&self) -> Option<String> {
        read_lost(&lost_file(&self.file)).map(|(_, e)| e)
    }
}

/// A lost-data note's mount point and error (see [`lost_file`]): the
/// mount point's bytes, a NUL (which no path holds), the error.
fn read_lost(f: &Path) -> Option<(PathBuf, String)> {
    let bytes = std::fs::read(f).ok()?;
    let nul = bytes.iter().position(|&b| b == 0)?;
    let at = PathBuf::from(std::ffi::OsString::from_vec(bytes[..nul].to_vec()));
    Some((at, String::from_utf8_lossy(&bytes[nul + 1..]).trim_end().to_string()))
}

/// Mounts of the cluster in `dir` that ended on their own (unmounted or
/// stopped outside `parcache down`) without pushing their dirty data:
/// each one's mount point and error. Their notes are removed.
pub fn take_losses(dir: &Path) -> Vec<(PathBuf, String)> {
    let Ok(rd) = std::fs::read_dir(dir.join("mounts")) else {
        return vec![];
    };
    let mut v = vec![];
    for e in rd.flatten() {
        let f = e.path();
        let Some(pid) = f
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".lost"))
        else {
            continue;
        };
        // A mount still recorded is reported when it ends.
        if f.with_file_name(pid).exists() {
            continue;
        }
        if let Some(l) = read_lost(&f) {
            v.push(l);
        }
        let _ = std::fs::remove_file(&f);
    }
    v.sort();
    v
}

/// Beside a mount's record (`mounts/PID`), the error of a mount that could
/// not push its dirty data at its end (`mounts/PID.lost`), for `parcache
/// down` to report: the mount is not its child, so it cannot see the exit.
fn lost_file(record: &Path) -> PathBuf {
    let mut f = record.as_os_str().to_owned();
    f.push(".lost");
    PathBuf::from(f)
}

/// The mounts recorded for the cluster in `dir`.
pub fn records(dir: &Path) -> Vec<MountRecord> {
    let Ok(rd) = std::fs::read_dir(dir.join("mounts")) else {
        return vec![];
    };
    let mut v: Vec<MountRecord> = rd
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse().ok()?;
            let mut at = std::fs::read(e.path()).ok()?;
            if at.last() == Some(&b'\n') {
                at.pop();
            }
            Some(MountRecord {
                pid,
                at: PathBuf::from(std::ffi::OsString::from_vec(at)),
                file: e.path(),
            })
        })
        .collect();
    v.sort_by_key(|m| m.pid);
    v
}

/// Removes this process's mount record when the mount ends.
struct Recorded(Option<PathBuf>);

impl Recorded {
    /// Leaves the error of a last push that failed beside the record, which
    /// goes when this is dropped (see [`lost_file`]).
    fn lost(&self, at: &Path, error: &str) {
        if let Some(f) = &self.0 {
            let at = absolute(at).unwrap_or_else(|| at.to_path_buf());
            let note = [at.as_os_str().as_bytes(), b"\0", error.as_bytes(), b"\n"].concat();
            if let Err(e) = std::fs::write(lost_file(f), note) {
                tracing::warn!("writing {}: {e}", lost_file(f).display());
            }
        }
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        if let Some(f) = &self.0 {
            let _ = std::fs::remove_file(f);
        }
    }
}

fn record(data: Option<&Path>, at: &Path) -> Result<Recorded> {
    let Some(dir) = data else { return Ok(Recorded(None)) };
    let d = dir.join("mounts");
    std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    let f = d.join(std::process::id().to_string());
    let at = absolute(at).unwrap_or_else(|| at.to_path_buf());
    // The path's bytes as they are: a name that is not UTF-8 is a name.
    std::fs::write(&f, [at.as_os_str().as_bytes(), b"\n"].concat())
        .with_context(|| format!("writing {}", f.display()))?;
    Ok(Recorded(Some(f)))
}

/// Mounts and serves in the foreground until the mount is unmounted
/// (`fusermount3 -u MNT`, `umount MNT`) or the process gets SIGINT or
/// SIGTERM; pushes every dirty block before it exits.
pub fn mount(a: MountArgs) -> Result<()> {
    crate::daemon::logging();
    clear_stale(&a.mountpoint)?;
    if !a.mountpoint.exists() {
        bail!(
            "mount point {} does not exist (make it with mkdir)",
            a.mountpoint.display()
        );
    }
    if !a.mountpoint.is_dir() {
        bail!("mount point {} is not a directory", a.mountpoint.display());
    }
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse is missing: this machine cannot mount FUSE file systems (scripts/setup.sh installs fuse3)");
    }
    let recorder = match &a.record {
        Some(p) => {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "node".into());
            let node = format!("{}/{}", host.trim(), std::process::id());
            let r = parcache_fuse::Recorder::create(p, node).with_context(|| {
                format!(
                    "--record {}: cannot start a trace there (it must not exist yet)",
                    p.display()
                )
            })?;
            Some(std::sync::Arc::new(r))
        }
        None => None,
    };
    let rt = crate::daemon::runtime()?;
    let cache = parcache_client::NodeCacheConfig {
        pool_bytes: a.cache_mib << 20,
        global_bytes: a.global_mib << 20,
        nv: a.nv_dir.clone().map(|dir| parcache_client::NvConfig {
            dir,
            bytes: a.nv_mib << 20,
        }),
        ..Default::default()
    };
    let fs = rt.block_on(a.target.connect_with(cache))?;
    let recorded = record(a.target.data_dir(), &a.mountpoint)?;
    // The node joins the cooperative tier and is listed by `parcache
    // status` while it beats.
    let name = std::fs::canonicalize(&a.mountpoint).unwrap_or_else(|_| a.mountpoint.clone());
    rt.block_on(fs.join_tier(name.display().to_string(), &a.peer_bind))
        .with_context(|| format!("--peer-bind {}", a.peer_bind))?;
    let mut m = Mount::new(fs.clone(), rt.handle().clone())
        .with_fuse_uring(match (a.io_uring, a.no_io_uring) {
            (true, _) => FuseQueues::On,
            _ => FuseQueues::Off,
        })
        .with_fuse_readers(a.fuse_threads as usize);
    let farewell = m.farewell();
    if let Some(r) = &recorder {
        m = m.with_recorder(r.clone());
    }
    let session = m
        .spawn(&a.mountpoint)
        .with_context(|| format!("mounting {} (is fusermount3 installed?)", a.mountpoint.display()))?;
    outln!("mounted on {}", a.mountpoint.display())?;
    if !a.lazy_cache {
        // Detached: the thread ends by itself, or with the process.
        if let Err(e) = rt.block_on(fs.take_cache_memory_ahead()) {
            tracing::warn!("node cache: its memory is taken as blocks fill it: {e}");
        }
    }
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
                _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {
                    if session.guard.is_finished() {
                        break;
                    }
                }
            }
        }
        anyhow::Ok(())
    })?;
    if session.guard.is_finished() {
        // Unmounted from outside: nothing left to unmount.
        std::mem::forget(session);
    } else {
        drop(session); // unmounts and ends the session
    }
    // The session's end does the last work (leave the tier, push dirty
    // data, give up leases); this waits for its outcome. A mount the
    // kernel would not unmount (busy) keeps its session going: after
    // `SESSION_END` this process does the work itself and exits.
    let asked = std::time::Instant::now();
    while !farewell.begun() && asked.elapsed() < SESSION_END {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // The session ends with the mount: one still going the kernel kept
    // mounted (busy). One that ended took this mount with it, and a mount
    // at the mount point now is someone else's, made since (a script's
    // `fusermount3 -u MNT; parcache mount … MNT`): not to be touched.
    let kept = !farewell.begun();
    let pushed = farewell.run(rt.handle());
    if let Err(e) = &pushed {
        recorded.lost(&a.mountpoint, e);
    }
    // Only the mount table is read: opening the directory, as `state`
    // does, would send a request through this process's own session.
    if kept && absolute(&a.mountpoint).is_some_and(|abs| listed(&abs)) {
        // Busy (a program's open file or working directory in it): the
        // kernel kept it mounted, and once this process exits it would be
        // a dead mount, every access failing with ENOTCONN until someone
        // unmounts it. Detached now, the mount point is a plain directory
        // again; the programs still in the mount get errors from then on.
        match lazy_unmount(&a.mountpoint) {
            Ok(()) => eprintln!(
                "parcache: {} was busy: detached it (programs still using it get errors now)",
                a.mountpoint.display()
            ),
            Err(e) => eprintln!("parcache: {e:#}"),
        }
    }
    if let (Some(r), Some(p)) = (&recorder, &a.record) {
        r.flush();
        eprintln!("parcache: trace recorded in {}", p.display());
    }
    pushed.map_err(|e| anyhow::anyhow!("pushing dirty data at unmount: {e}"))
}

/// How long a stopping mount waits for its session to end once unmounted.
const SESSION_END: std::time::Duration = std::time::Duration::from_secs(2);
