//! `parcache up`, `down`, `status`: a whole cluster on this host.
//!
//! `DIR/cluster.json` records the servers (addresses and process ids) as
//! each starts, so nothing `up` started is ever invisible to `down`, and a
//! restart reuses the same ports. Every mount of the cluster records itself
//! in `DIR/mounts/` (see [`crate::mount`]), so `down` unmounts each one or
//! says which is still in use.

use crate::mount::{self, MountState};
use anyhow::{bail, Context, Result};
use clap::Args;
use parcache_proto::{Client, ConnError, Request, Response, Secret};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What `up` records in DIR/cluster.json.
#[derive(Serialize, Deserialize, Debug, Default, Clone)]
pub struct ClusterFile {
    pub mds: String,
    pub iods: Vec<String>,
    /// Data servers' process ids in order, then the metadata server's.
    pub pids: Vec<u32>,
}

#[derive(Args)]
pub struct UpArgs {
    /// Directory for the whole cluster (one subdirectory per server, the secret).
    #[arg(long, value_name = "DIR")]
    pub data: PathBuf,
    /// Number of data servers [default: 4 for a new cluster, the recorded
    /// number for a restart].
    #[arg(long, value_name = "N")]
    pub iods: Option<u32>,
    /// Metadata server on port P, data servers on P+1…; default: the ports
    /// of the cluster's last run, or free ports for a new cluster.
    #[arg(long, value_name = "P")]
    pub port_base: Option<u16>,
    /// Also mount the cluster here (FUSE; `down` unmounts it first).
    #[arg(long, value_name = "MNT")]
    pub mount: Option<PathBuf>,
}

#[derive(Args)]
pub struct DataArg {
    /// The cluster's directory (as given to `parcache up`).
    #[arg(long, value_name = "DIR")]
    pub data: PathBuf,
}

/// How long `down` and `status` wait for one server to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

fn cluster_file(dir: &Path) -> PathBuf {
    dir.join("cluster.json")
}

pub fn read_cluster(dir: &Path) -> Result<ClusterFile> {
    let p = cluster_file(dir);
    let s = std::fs::read_to_string(&p).with_context(|| {
        format!(
            "{}: no cluster here (start one with `parcache up --data {}`)",
            p.display(),
            dir.display()
        )
    })?;
    serde_json::from_str(&s).with_context(|| format!("{} is damaged", p.display()))
}

/// Writes DIR/cluster.json whole: a temporary file renamed over it, or,
/// on a disk too full for a second copy, in place.
fn write_cluster(dir: &Path, c: &ClusterFile) -> Result<()> {
    let text = serde_json::to_string_pretty(c)?;
    let tmp = dir.join("cluster.json.tmp");
    let r = std::fs::write(&tmp, &text).and_then(|()| std::fs::rename(&tmp, cluster_file(dir)));
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::StorageFull => {
            let _ = std::fs::remove_file(&tmp);
            std::fs::write(cluster_file(dir), &text)
        }
        r => r,
    }
    .with_context(|| format!("writing {}", cluster_file(dir).display()))
}

pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, sig);
    }
}

/// Waits until none of `pids` runs, at most `limit`; returns those still running.
fn wait_gone(pids: &[u32], limit: Duration) -> Vec<u32> {
    let until = Instant::now() + limit;
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() || Instant::now() > until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops processes: SIGTERM (they flush and checkpoint), then after
/// `grace` SIGKILL (acknowledged writes are in their logs either way).
fn stop_pids(pids: &[u32], grace: Duration) -> Vec<u32> {
    for &p in pids {
        signal(p, rustix::process::Signal::TERM);
    }
    let left = wait_gone(pids, grace);
    for &p in &left {
        signal(p, rustix::process::Signal::KILL);
    }
    left
}

/// Starts `parcache ARGS` detached, and waits for the line starting with
/// `ready` on its standard output; returns the pid and the rest of the line.
/// If it does not start, the error quotes what it logged this time.
fn spawn_until(args: &[OsString], log: &Path, ready: &str) -> Result<(u32, String)> {
    let mut logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let from = logf.seek(SeekFrom::End(0))?;
    let mut child = Command::new(std::env::current_exe()?)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(logf.try_clone()?)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting parcache {}", args[0].to_string_lossy()))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    let Some(addr) = line.trim().strip_prefix(ready) else {
        let _ = child.kill();
        let _ = child.wait();
        let mut said = String::new();
        logf.seek(SeekFrom::Start(from))?;
        let _ = logf.read_to_string(&mut said);
        let last: Vec<&str> = said.lines().rev().take(5).collect();
        bail!(
            "parcache {} did not start (log {}):\n{}",
            args[0].to_string_lossy(),
            log.display(),
            last.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    };
    Ok((child.id(), addr.to_string()))
}

/// The port of a recorded `HOST:PORT` address.
fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit_once(':')?.1.parse().ok()
}

/// Marks every descriptor this process inherited past standard error
/// close-on-exec, so the daemons `up` starts do not keep them open (a
/// shell's file on a mount kept it from being unmounted; a caller's pipe
/// would never see its end).
fn no_inherited_descriptors() {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    for fd in fds
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
    {
        if fd > 2 {
            // The directory read here is among them (already close-on-exec).
            let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC));
        }
    }
}

pub fn up(a: UpArgs) -> Result<()> {
    no_inherited_descriptors();
    let dir = &a.data;
    if dir.exists() && !dir.is_dir() {
        bail!("--data {}: not a directory", dir.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let old = if cluster_file(dir).exists() {
        Some(read_cluster(dir)?)
    } else {
        None
    };
    if let Some(c) = &old {
        if c.pids.iter().any(|&p| alive(p)) {
            let whole = c.pids.len() == c.iods.len() + 1;
            // Every server up: only a mount asked for is left to do.
            if !whole || (c.pids.iter().all(|&p| alive(p)) && a.mount.is_none()) {
                bail!(
                    "a cluster is already running in {} (metadata server {}); `parcache down --data {}` stops it",
                    dir.display(),
                    c.mds,
                    dir.display()
                );
            }
            if a.iods.is_some() || a.port_base.is_some() {
                bail!(
                    "{}: some of its servers run; `parcache up --data {}` alone restarts the others                      (--iods and --port-base are for a cluster that is stopped)",
                    dir.display(),
                    dir.display()
                );
            }
            return restart_down(dir, c.clone(), a.mount.as_deref());
        }
        if a.iods.is_some_and(|n| n as usize != c.iods.len()) {
            bail!(
                "{} is a cluster of {} data servers; restart it with --iods {} (or without --iods)",
                dir.display(),
                c.iods.len(),
                c.iods.len()
            );
        }
    }
    let iods = a.iods.or(old.as_ref().map(|c| c.iods.len() as u32)).unwrap_or(4);
    if iods == 0 {
        bail!("--iods must be at least 1");
    }
    if let Some(p) = a.port_base {
        if p == 0 || p as u32 + iods > 65535 {
            bail!(
                "--port-base {p}: the servers take ports {p} to {}, which must lie within 1–65535",
                p as u32 + iods
            );
        }
    }
    if let Some(mnt) = &a.mount {
        mount::clear_stale(mnt)?;
    }
    let secret_file = dir.join("secret");
    if !secret_file.exists() {
        Secret::generate().save(&secret_file)?;
    }
    // Each server's port: from --port-base, else the last run's (so other
    // nodes and hand mounts find the cluster again), else any free one.
    let port = |i: usize| -> u16 {
        match (a.port_base, &old) {
            (Some(p), _) => p + i as u16,
            (None, Some(c)) => {
                let addr = if i == 0 { Some(&c.mds) } else { c.iods.get(i - 1) };
                addr.and_then(|x| port_of(x)).unwrap_or(0)
            }
            (None, None) => 0,
        }
    };
    let mut c = ClusterFile::default();
    let started = start_servers(iods, dir, &secret_file, &port, &mut c);
    if let Err(e) = started {
        let left = stop_pids(&c.pids, Duration::from_secs(10));
        c.pids.retain(|p| left.contains(p));
        let _ = write_cluster(dir, &c);
        return Err(e.context(format!(
            "parcache up --data {}: the servers it had started are stopped again",
            dir.display()
        )));
    }
    if let Some(mnt) = &a.mount {
        mount_cluster(dir, mnt)?;
    }
    said_up(dir, &c);
    println!("  copy in:  parcache cp --data {} ./file pc:/file", dir.display());
    println!("  stop:     parcache down --data {}", dir.display());
    Ok(())
}

/// Restarts the servers of a running cluster that are down (a data server
/// killed, say) at their recorded addresses, leaving the others and their
/// mounts alone: the clients reconnect to them.
fn restart_down(dir: &Path, mut c: ClusterFile, mount: Option<&Path>) -> Result<()> {
    let secret_file = dir.join("secret");
    let n = c.iods.len();
    for i in 0..=n {
        if alive(c.pids[i]) {
            continue;
        }
        let (what, addr) = if i < n {
            (format!("data server {i}"), c.iods[i].clone())
        } else {
            ("metadata server".to_string(), c.mds.clone())
        };
        let port = port_of(&addr).unwrap_or(0);
        let started = if i < n {
            start_iod(i, dir, &secret_file, port)
        } else {
            start_mds(dir, &secret_file, port, &c.iods)
        };
        let (pid, now) = started.with_context(|| format!("restarting the {what} of {} ({addr})", dir.display()))?;
        c.pids[i] = pid;
        write_cluster(dir, &c)?;
        println!("  restarted the {what} ({now}), which was down");
    }
    if let Some(mnt) = mount {
        // A mount this cluster recorded there whose process is gone is
        // dead, even where the kernel still lets the directory be opened
        // a moment after the kill.
        let at = mount::absolute(mnt);
        let mine: Vec<_> = mount::records(dir)
            .into_iter()
            .filter(|m| Some(&m.at) == at.as_ref())
            .collect();
        let dead = !mine.is_empty() && mine.iter().all(|m| !alive(m.pid));
        match mount::state(mnt) {
            MountState::Live if !dead => {}
            MountState::Live => {
                mount::lazy_unmount(mnt)?;
                eprintln!(
                    "parcache: {} was a dead mount (its process was killed): unmounted it",
                    mnt.display()
                );
                mine.into_iter().for_each(mount::MountRecord::forget);
                mount_cluster(dir, mnt)?;
            }
            _ => {
                mount::clear_stale(mnt)?;
                mount_cluster(dir, mnt)?;
            }
        }
    }
    said_up(dir, &c);
    Ok(())
}

/// Mounts the running cluster in `dir` on `mnt` (a `parcache mount`
/// process of its own).
fn mount_cluster(dir: &Path, mnt: &Path) -> Result<()> {
    std::fs::create_dir_all(mnt).with_context(|| format!("creating mount point {}", mnt.display()))?;
    // Paths as they are (a name need not be UTF-8).
    let args: Vec<OsString> = vec!["mount".into(), "--data".into(), dir.into(), mnt.into()];
    spawn_until(&args, &dir.join("mount.log"), "mounted on ")
        .with_context(|| format!("the cluster runs, but mounting it on {} failed", mnt.display()))?;
    println!("  mounted on {}", mnt.display());
    Ok(())
}

/// Says where the cluster's servers are.
fn said_up(dir: &Path, c: &ClusterFile) {
    println!(
        "parcache cluster in {}: metadata server {}, {} data servers",
        dir.display(),
        c.mds,
        c.iods.len()
    );
}

/// Starts data server `i` of the cluster in `dir` on `port` (0: any).
fn start_iod(i: usize, dir: &Path, secret_file: &Path, port: u16) -> Result<(u32, String)> {
    start_server("iod", &format!("iod-{i}"), dir, secret_file, port, Vec::new())
}

/// Starts the metadata server of the cluster in `dir` on `port` (0: any),
/// with its data servers at `iods`.
fn start_mds(dir: &Path, secret_file: &Path, port: u16, iods: &[String]) -> Result<(u32, String)> {
    let extra = iods.iter().flat_map(|a| ["--iod".to_string(), a.clone()]).collect();
    start_server("mds", "mds", dir, secret_file, port, extra)
}

/// Starts `parcache ROLE` with its data in `dir/NAME` and its log in
/// `dir/NAME.log`, listening on loopback at `port`, with `extra` arguments.
fn start_server(
    role: &str,
    name: &str,
    dir: &Path,
    secret_file: &Path,
    port: u16,
    extra: Vec<String>,
) -> Result<(u32, String)> {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    // Paths as they are (a name need not be UTF-8).
    let mut args: Vec<OsString> = vec![
        role.into(),
        "--data".into(),
        d.into(),
        "--listen".into(),
        format!("127.0.0.1:{port}").into(),
        "--secret-file".into(),
        secret_file.into(),
    ];
    args.extend(extra.into_iter().map(OsString::from));
    spawn_until(&args, &dir.join(format!("{name}.log")), "listening on ")
}

/// Starts the data servers, then the metadata server, recording each in
/// DIR/cluster.json as it starts.
fn start_servers(
    iods: u32,
    dir: &Path,
    secret_file: &Path,
    port: &dyn Fn(usize) -> u16,
    c: &mut ClusterFile,
) -> Result<()> {
    for i in 0..iods as usize {
        let (pid, addr) = start_iod(i, dir, secret_file, port(1 + i))?;
        c.pids.push(pid);
        c.iods.push(addr);
        write_cluster(dir, c)?;
    }
    let (pid, mds) = start_mds(dir, secret_file, port(0), &c.iods)?;
    c.pids.push(pid);
    c.mds = mds;
    write_cluster(dir, c)
}

/// Unmounts every recorded mount of the cluster in `dir` (each pushes its
/// dirty data as it goes); a dead one is unmounted lazily. Fails naming
/// the mounts still in use. Returns what each mount could not push at its
/// end (its dirty data, lost: its servers were gone), to be reported.
fn unmount_all(dir: &Path) -> Result<Vec<String>> {
    let mut busy = vec![];
    let mut lost = vec![];
    let records = mount::records(dir);
    // Mount points where a mount of this cluster is served now. A killed
    // mount's record may name one of them too (mounted again there since):
    // the mount there is then the live one, unmounted (or found busy) by
    // its own record, never detached for the dead one.
    let served: Vec<PathBuf> = records.iter().filter(|m| alive(m.pid)).map(|m| m.at.clone()).collect();
    for m in records {
        match mount::state(&m.at) {
            MountState::Live | MountState::Stale if !alive(m.pid) && served.contains(&m.at) => {}
            MountState::Live if alive(m.pid) => {
                let ok = Command::new("fusermount3")
                    .arg("-u")
                    .arg(&m.at)
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if !ok {
                    busy.push(format!("{} (mount process {})", m.at.display(), m.pid));
                    continue;
                }
                if !wait_gone(&[m.pid], Duration::from_secs(30)).is_empty() {
                    bail!(
                        "the mount on {} (process {}) did not end within 30 s of its unmount",
                        m.at.display(),
                        m.pid
                    );
                }
                if let Some(e) = m.lost() {
                    lost.push(format!("the mount on {} lost its dirty data: {e}", m.at.display()));
                }
            }
            MountState::Live | MountState::Stale => {
                mount::lazy_unmount(&m.at)?;
                eprintln!(
                    "parcache down: unmounted {}, whose mount process had died",
                    m.at.display()
                );
            }
            MountState::NotMounted => {
                if alive(m.pid) {
                    stop_pids(&[m.pid], Duration::from_secs(10));
                }
            }
        }
        m.forget();
    }
    // Mounts that ended before, on their own, without pushing everything.
    for (at, e) in mount::take_losses(dir) {
        lost.push(format!("the mount on {} lost its dirty data: {e}", at.display()));
    }
    if !busy.is_empty() {
        for l in &lost {
            eprintln!("parcache down: {l}");
        }
        bail!(
            "still mounted and in use: {}; close the programs using it (`fuser -vm MNT` lists them) and run \
             `parcache down` again (the servers keep running until then)",
            busy.join(", ")
        );
    }
    Ok(lost)
}

pub fn down(a: DataArg) -> Result<()> {
    if !cluster_file(&a.data).exists() {
        return down_orphans(&a.data);
    }
    let c = read_cluster(&a.data)?;
    let lost = unmount_all(&a.data)?;
    let running: Vec<u32> = c.pids.iter().copied().filter(|&p| alive(p)).collect();
    if running.is_empty() {
        println!("parcache cluster in {} is stopped already", a.data.display());
        if !lost.is_empty() {
            for l in &lost {
                eprintln!("parcache down: {l}");
            }
            bail!("{} mount(s) lost dirty data (see above)", lost.len());
        }
        return Ok(());
    }
    let secret = Secret::load(&a.data.join("secret"))?;
    let rt = crate::daemon::runtime()?;
    // The metadata server first, then the data servers (they checkpoint
    // their logs before they answer).
    // cluster.json lists the data servers' pids first, the metadata server's last.
    let mut addrs = vec![(c.mds.clone(), c.pids.last().copied())];
    addrs.extend(c.iods.iter().cloned().zip(c.pids.iter().copied().map(Some)));
    let mut problems = lost;
    rt.block_on(async {
        for (addr, pid) in &addrs {
            if pid.is_some_and(|p| !alive(p)) {
                // Crashed or killed before: nothing to stop, and its log
                // is replayed at the next `up`.
                println!("{addr} was not running");
                continue;
            }
            let ask = async {
                let cl = Client::connect(addr, &secret).await?;
                anyhow::Ok(cl.call(&Request::Shutdown, &[]).await?.0)
            };
            match tokio::time::timeout(ANSWER_WITHIN, ask).await {
                Ok(Ok(Response::Error(e))) => problems.push(format!("{addr}: {}", e.message)),
                Ok(Ok(_)) => {}
                // Gone before its answer came: it stopped, as asked.
                Ok(Err(e))
                    if e.downcast_ref::<ConnError>()
                        .is_some_and(|c| matches!(c, ConnError::Closed { .. })) => {}
                Ok(Err(e)) => problems.push(format!("{addr}: {e:#}")),
                Err(_) => problems.push(format!("{addr}: no answer within {ANSWER_WITHIN:?}")),
            }
        }
    });
    let mut left = wait_gone(&running, Duration::from_secs(30));
    if !left.is_empty() {
        problems.push(format!(
            "processes {left:?} did not stop within 30 s: stopped with signals"
        ));
        left = stop_pids(&left, Duration::from_secs(5));
    }
    for p in &problems {
        eprintln!("parcache down: {p}");
    }
    if !left.is_empty() {
        problems.push(format!(
            "killed {left:?} (their write logs keep every acknowledged write)"
        ));
    }
    println!("parcache cluster in {} stopped", a.data.display());
    if problems.is_empty() {
        Ok(())
    } else {
        bail!("{} problem(s) while stopping (see above)", problems.len())
    }
}

/// `down` where `DIR/cluster.json` is missing: the directory was removed
/// (or emptied) under a running cluster, whose daemons then ran on with
/// nothing left to find them by. Stops every `parcache` daemon and mount
/// on this host whose `--data` lies in `dir` (SIGTERM, then SIGKILL after
/// 30 s: there is no secret left to ask them with, and nothing left on
/// the disk for them to keep); without any, the usual "no cluster here".
fn down_orphans(dir: &Path) -> Result<()> {
    let want = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    // (pid, whether a mount)
    let mut found: Vec<(u32, bool)> = Vec::new();
    pids.sort_unstable();
    for pid in pids {
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
        // Only a cluster whose record is gone: `down` of a directory
        // holding running clusters leaves them be.
        match cluster_of(&cmdline, &cwd) {
            Some((c, mount)) if pid != std::process::id() && c.starts_with(&want) && !cluster_file(&c).exists() => {
                found.push((pid, mount))
            }
            _ => {}
        }
    }
    if found.is_empty() {
        read_cluster(dir)?;
    }
    eprintln!(
        "parcache down: {} is gone, but {} parcache process(es) still run with their --data in {} (was the directory removed under them?): stopping {:?}",
        cluster_file(dir).display(),
        found.len(),
        dir.display(),
        found.iter().map(|f| f.0).collect::<Vec<_>>()
    );
    // The mounts first, while the servers still answer their last pushes.
    for mounts in [true, false] {
        let pids: Vec<u32> = found.iter().filter(|f| f.1 == mounts).map(|f| f.0).collect();
        let left = stop_pids(&pids, Duration::from_secs(30));
        if !left.is_empty() {
            eprintln!("parcache down: {left:?} did not stop within 30 s of SIGTERM: killed");
        }
    }
    println!("parcache cluster in {} stopped", dir.display());
    Ok(())
}

/// The cluster directory of a `parcache iod`, `mds` or `mount` process
/// that `up` started, from its `cmdline` (NUL-separated) and working
/// directory `cwd`: a mount's `--data`, or the directory above a
/// server's (`DIR/iod-N`, `DIR/mds`); with whether it is a mount. `None`
/// for any other process.
fn cluster_of(cmdline: &[u8], cwd: &Path) -> Option<(PathBuf, bool)> {
    use std::os::unix::ffi::OsStrExt;
    let args: Vec<&Path> = cmdline
        .split(|&b| b == 0)
        .map(|a| Path::new(std::ffi::OsStr::from_bytes(a)))
        .collect();
    if !args.first()?.file_name()?.as_bytes().starts_with(b"parcache") {
        return None;
    }
    let role = args.get(1)?.to_str()?;
    let data = args.windows(2).find(|w| w[0].as_os_str() == "--data")?[1];
    // A removed working directory reads as "PATH (deleted)".
    let cwd = cwd
        .to_str()
        .and_then(|c| c.strip_suffix(" (deleted)"))
        .map_or(cwd, Path::new);
    let data = cwd.join(data);
    let name = data.file_name()?.to_str()?;
    let server = name == "mds" || name.strip_prefix("iod-").is_some_and(|n| n.parse::<u32>().is_ok());
    match role {
        "mount" => Some((data, true)),
        "iod" | "mds" if server => data.parent().map(|d| (d.to_path_buf(), false)),
        _ => None,
    }
}

/// 1536 → "1.5K", in powers of 1024.
fn human(n: u64) -> String {
    let mut v = n as f64;
    for unit in ["", "K", "M", "G", "T"] {
        if v < 1024.0 || unit == "T" {
            return if unit.is_empty() {
                format!("{n}")
            } else {
                format!("{v:.1}{unit}")
            };
        }
        v /= 1024.0;
    }
    unreachable!()
}

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    data: DataArg,
    /// Output format on standard output.
    #[arg(long, value_enum, default_value_t = crate::sim::Format::Table)]
    format: crate::sim::Format,
}

/// What `status` found: every server (its counters, or `None` if it did not
/// answer), the content-addressed chunks, this host's mounts, and the
/// nodes the metadata server heard from.
#[derive(Serialize)]
struct StatusReport {
    /// The cluster's id (`None`: the metadata server did not answer); its
    /// mounts show `parcache:ID` as their source.
    cluster: Option<String>,
    servers: Vec<ServerRow>,
    /// Chunk slots the recipes name (logical).
    chunks_named: u64,
    /// Chunks the data servers store, and their bytes (physical).
    chunks_stored: u64,
    chunk_bytes: u64,
    mounts: Vec<MountRow>,
    nodes: Vec<parcache_proto::NodeInfo>,
}

#[derive(Serialize)]
struct ServerRow {
    name: String,
    address: String,
    stats: Option<parcache_proto::msg::ServerStats>,
}

#[derive(Serialize)]
struct MountRow {
    at: PathBuf,
    pid: u32,
    state: &'static str,
}

/// `parcache drop-caches`: each data server writes its dirty blocks down
/// and forgets every block (`Request::DropCaches`); one that does not
/// answer, or fails, is named and the command fails after asking the rest.
pub fn drop_caches(a: DataArg) -> Result<()> {
    let dir = &a.data;
    let (c, secret) = running_cluster(dir)?;
    let rt = crate::daemon::runtime()?;
    let failed: Vec<String> = rt.block_on(async {
        let mut failed = vec![];
        for (i, address) in c.iods.iter().enumerate() {
            let ask = async {
                let cl = Client::connect(address, &secret).await.map_err(|e| e.to_string())?;
                match cl.call(&Request::DropCaches, &[]).await.map_err(|e| e.to_string())? {
                    (Response::Ok, _) => Ok(()),
                    (Response::Error(e), _) => Err(e.message),
                    (other, _) => Err(format!("unexpected answer {other:?}")),
                }
            };
            let outcome = match tokio::time::timeout(DROP_WITHIN, ask).await {
                Ok(r) => r,
                Err(_) => Err(format!("no answer within {} s", DROP_WITHIN.as_secs())),
            };
            if let Err(e) = outcome {
                failed.push(format!("data server {i} ({address}): {e}"));
            }
        }
        failed
    });
    if !failed.is_empty() {
        bail!("could not empty every data server's cache:\n  {}", failed.join("\n  "));
    }
    println!(
        "emptied the caches of {} data server{} in {}",
        c.iods.len(),
        if c.iods.len() == 1 { "" } else { "s" },
        dir.display()
    );
    Ok(())
}

/// How long `drop-caches` waits for one data server (it writes its dirty
/// blocks down first).
const DROP_WITHIN: Duration = Duration::from_secs(120);

/// The cluster in `dir` and its secret, if any of its servers runs; a
/// stopped cluster is named, with how to start it.
fn running_cluster(dir: &Path) -> Result<(ClusterFile, Secret)> {
    let c = read_cluster(dir)?;
    if !c.pids.iter().any(|&p| alive(p)) {
        bail!(
            "the parcache cluster in {} is stopped (start it with `parcache up --data {}`)",
            dir.display(),
            dir.display()
        );
    }
    let secret = Secret::load(&dir.join("secret"))?;
    Ok((c, secret))
}

pub fn status(a: StatusArgs) -> Result<()> {
    let dir = &a.data.data;
    let (c, secret) = running_cluster(dir)?;
    let rt = crate::daemon::runtime()?;
    let mut addrs = vec![("mds".to_string(), c.mds.clone())];
    addrs.extend(c.iods.iter().enumerate().map(|(i, a)| (format!("iod {i}"), a.clone())));
    let report = rt.block_on(async {
        let mut r = StatusReport {
            cluster: None,
            servers: vec![],
            chunks_named: 0,
            chunks_stored: 0,
            chunk_bytes: 0,
            mounts: vec![],
            nodes: vec![],
        };
        for (name, address) in addrs {
            let ask = async {
                let cl = Client::connect(&address, &secret).await.ok()?;
                cl.call(&Request::Stats, &[]).await.ok()
            };
            let stats = match tokio::time::timeout(ANSWER_WITHIN, ask).await {
                Ok(Some((Response::Stats(s), _))) => Some(s),
                _ => None,
            };
            if let Some(s) = &stats {
                // Slots the recipes name (logical, at the metadata server)
                // and chunks stored (physical, at the data servers).
                if name == "mds" {
                    r.chunks_named = s.chunks;
                } else {
                    r.chunks_stored += s.chunks;
                    r.chunk_bytes += s.chunk_bytes;
                }
            }
            r.servers.push(ServerRow { name, address, stats });
        }
        for m in mount::records(dir) {
            let state = match (mount::state(&m.at), alive(m.pid)) {
                (MountState::Live, true) => "mounted",
                (MountState::NotMounted, _) => "not mounted",
                _ => "dead",
            };
            r.mounts.push(MountRow {
                at: m.at,
                pid: m.pid,
                state,
            });
        }
        // The nodes heard from in the last 15 s, with their counters, and
        // the cluster's id.
        let ask = async {
            let cl = Client::connect(&c.mds, &secret).await.ok()?;
            let nodes = cl.call(&Request::Nodes, &[]).await.ok()?;
            Some((nodes, cl.call(&Request::Cluster, &[]).await.ok()))
        };
        if let Ok(Some((nodes, id))) = tokio::time::timeout(ANSWER_WITHIN, ask).await {
            if let (Response::Nodes(nodes), _) = nodes {
                r.nodes = nodes;
            }
            if let Some((Response::Cluster(id), _)) = id {
                r.cluster = Some(id);
            }
        }
        r
    });
    match a.format {
        crate::sim::Format::Json => outln!("{}", serde_json::to_string_pretty(&report)?)?,
        crate::sim::Format::Table => print_status(&report)?,
    }
    let down = report.servers.iter().filter(|s| s.stats.is_none()).count();
    if down > 0 {
        bail!("{down} of {} servers are down", c.pids.len());
    }
    Ok(())
}

fn print_status(r: &StatusReport) -> Result<()> {
    outln!(
        "{:<7} {:<16} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9}  policy",
        "server",
        "address",
        "state",
        "size",
        "free",
        "cache",
        "log",
        "hits",
        "dirty",
        "immediate",
        "misses",
        "written",
        "absorbed",
        "syncs",
        "requests"
    )?;
    for row in &r.servers {
        match &row.stats {
            Some(s) => outln!(
                "{:<7} {:<16} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9}  {}",
                row.name,
                row.address,
                "up",
                human(s.capacity_bytes),
                human(s.free_bytes),
                // The memory its cache holds (a data server's; none at the
                // metadata server).
                if s.role.starts_with("iod") {
                    human(s.cache_memory_bytes)
                } else {
                    "-".into()
                },
                human(s.log_bytes),
                s.read_hits,
                s.dirty_blocks,
                s.immediate_writes,
                s.read_misses,
                s.writes_down,
                s.overwrites,
                s.syncs,
                s.requests,
                s.role
            )?,
            None => outln!("{:<7} {:<16} {:>5}", row.name, row.address, "DOWN")?,
        }
    }
    if let Some(id) = &r.cluster {
        outln!("cluster {id} (its mounts' source in the mount tables: parcache:{id})")?;
    }
    if r.chunks_named + r.chunks_stored > 0 {
        outln!(
            "chunks  {} named by recipes (logical), {} stored ({}, physical)",
            r.chunks_named,
            r.chunks_stored,
            human(r.chunk_bytes)
        )?;
    }
    for m in &r.mounts {
        let state = match m.state {
            "dead" => "DEAD (`parcache down` or `fusermount3 -u -z` removes it)",
            s => s,
        };
        outln!("mount   {} (process {}): {state}", m.at.display(), m.pid)?;
    }
    for n in &r.nodes {
        outln!(
            "node    {:016x} {}: heard {:.1} s ago; local hits {}, remote hits {}, data-server reads {}, \
             forwards {}, recirculations {}, peer requests served {}",
            n.node,
            n.name,
            n.silent_ms as f64 / 1e3,
            n.stats.local_hits,
            n.stats.remote_hits,
            n.stats.server_reads,
            n.stats.forwards,
            n.stats.recirculations,
            n.stats.served
        )?;
        let st = &n.stats;
        if st.local_part_reads + st.local_part_refused > 0 {
            outln!(
                "        local reads (reads from this machine's data servers' part files): {} \
                 (of them, only the pages a random reader asked for: {}), \
                 sent to the server instead (its write log held their bytes): {}",
                st.local_part_reads,
                st.local_part_short,
                st.local_part_refused
            )?;
        }
        if st.server_page_reads > 0 {
            outln!(
                "        random reads of a few pages answered by a data server with only those pages: {}",
                st.server_page_reads
            )?;
        }
        let bypasses =
            st.local_read_bypasses + st.local_write_bypasses + st.global_read_bypasses + st.global_write_bypasses;
        if bypasses + st.global_hits + st.global_misses > 0 {
            let hist: Vec<String> = st
                .segment_counters
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(i, n)| match i {
                    0 => format!("0:{n}"),
                    11 => format!("1024+:{n}"),
                    i => format!("{}-{}:{n}", 1u32 << (i - 1), (1u32 << i) - 1),
                })
                .collect();
            outln!(
                "        bypasses: local reads {}, local writes {}, global reads {}, global writes {}; \
                 global cache: hits {}, misses {}, kept out by the runtime {}; segment counters {}",
                st.local_read_bypasses,
                st.local_write_bypasses,
                st.global_read_bypasses,
                st.global_write_bypasses,
                st.global_hits,
                st.global_misses,
                st.global_kept_out,
                if hist.is_empty() {
                    "-".to_string()
                } else {
                    hist.join(" ")
                }
            )?;
        }
        if st.nv_capacity_bytes > 0 || st.nv_writes > 0 {
            outln!(
                "        durable write cache ({}): writes {}, read hits {}, absorbed overwrites {}, \
                 write-backs {} (immediate {}), blocks not yet down {}, delivered at start {}",
                if st.nv_capacity_bytes > 0 {
                    human(st.nv_capacity_bytes)
                } else {
                    "none: nv=on files written through".to_string()
                },
                st.nv_writes,
                st.nv_hits,
                st.nv_overwrites,
                st.nv_write_backs,
                st.nv_immediate,
                st.nv_live_blocks,
                st.nv_replayed
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_is_found_from_its_daemons_command_lines() {
        let cmd = |args: &[&str]| args.join("\0").into_bytes();
        let cwd = Path::new("/home/u");
        let iod = cmd(&[
            "/usr/bin/parcache",
            "iod",
            "--data",
            "/tmp/pc/iod-2",
            "--listen",
            "127.0.0.1:0",
        ]);
        assert_eq!(cluster_of(&iod, cwd), Some((PathBuf::from("/tmp/pc"), false)));
        let mds = cmd(&["parcache", "mds", "--data", "pc/mds"]);
        assert_eq!(cluster_of(&mds, cwd), Some((PathBuf::from("/home/u/pc"), false)));
        let gone = Path::new("/home/u (deleted)");
        assert_eq!(cluster_of(&mds, gone), Some((PathBuf::from("/home/u/pc"), false)));
        let mount = cmd(&["./target/release/parcache", "mount", "--data", "/tmp/pc", "/mnt"]);
        assert_eq!(cluster_of(&mount, cwd), Some((PathBuf::from("/tmp/pc"), true)));
        // A server started by hand in a directory of its own, another
        // program, another command: none is a cluster's.
        assert_eq!(
            cluster_of(&cmd(&["parcache", "iod", "--data", "/srv/disk1"]), cwd),
            None
        );
        assert_eq!(cluster_of(&cmd(&["vim", "iod", "--data", "/tmp/pc/iod-0"]), cwd), None);
        assert_eq!(
            cluster_of(&cmd(&["parcache", "cp", "--data", "/tmp/pc", "a", "b"]), cwd),
            None
        );
        assert_eq!(cluster_of(b"", cwd), None);
    }
}
