//! `parcache up`, `down`, `status`: a whole cluster on this host.

use anyhow::{bail, Context, Result};
use clap::Args;
use parcache_proto::{Client, Request, Response, Secret};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// What `up` records in DIR/cluster.json.
#[derive(Serialize, Deserialize, Debug)]
pub struct ClusterFile {
    pub mds: String,
    pub iods: Vec<String>,
    pub pids: Vec<u32>,
    /// Mounts started by `up --mount`: (mount point, process id).
    #[serde(default)]
    pub mounts: Vec<(PathBuf, u32)>,
}

#[derive(Args)]
pub struct UpArgs {
    /// Directory for the whole cluster (one subdirectory per server, the secret).
    #[arg(long, value_name = "DIR")]
    pub data: PathBuf,
    /// Number of data servers.
    #[arg(long, default_value_t = 4)]
    pub iods: u32,
    /// Metadata server on port P, data servers on P+1…; default: free ports.
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

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
}

/// Starts one daemon detached from this process, returning its pid and address.
fn spawn(args: &[String], log: &Path) -> Result<(u32, String)> {
    spawn_until(args, log, "listening on ")
}

/// Starts `parcache ARGS` detached, and waits for the line starting with
/// `ready` on its standard output; returns the pid and the rest of the line.
fn spawn_until(args: &[String], log: &Path, ready: &str) -> Result<(u32, String)> {
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let mut child = Command::new(std::env::current_exe()?)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(logf)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting parcache {}", args[0]))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    let Some(addr) = line.trim().strip_prefix(ready) else {
        let _ = child.kill();
        let tail = std::fs::read_to_string(log).unwrap_or_default();
        let last: Vec<&str> = tail.lines().rev().take(5).collect();
        bail!(
            "parcache {} did not start; its log {} ends with:\n{}",
            args[0],
            log.display(),
            last.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    };
    Ok((child.id(), addr.to_string()))
}

pub fn up(a: UpArgs) -> Result<()> {
    if a.iods == 0 {
        bail!("--iods must be at least 1");
    }
    let dir = &a.data;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if let Ok(c) = read_cluster(dir) {
        if c.pids.iter().any(|&p| alive(p)) {
            bail!(
                "a cluster is already running in {} (metadata server {}); `parcache down --data {}` stops it",
                dir.display(),
                c.mds,
                dir.display()
            );
        }
        if c.iods.len() != a.iods as usize {
            bail!(
                "{} was a cluster of {} data servers; restart it with --iods {}",
                dir.display(),
                c.iods.len(),
                c.iods.len()
            );
        }
    }
    let secret_file = dir.join("secret");
    if !secret_file.exists() {
        Secret::generate().save(&secret_file)?;
    }
    let port = |i: u16| a.port_base.map_or(0, |p| p + i);
    let s = |x: &Path| x.to_string_lossy().into_owned();
    let mut pids = vec![];
    let mut iods = vec![];
    for i in 0..a.iods {
        let d = dir.join(format!("iod-{i}"));
        std::fs::create_dir_all(&d)?;
        let args = vec![
            "iod".into(),
            "--data".into(),
            s(&d),
            "--listen".into(),
            format!("127.0.0.1:{}", port(1 + i as u16)),
            "--secret-file".into(),
            s(&secret_file),
        ];
        let (pid, addr) = spawn(&args, &dir.join(format!("iod-{i}.log")))?;
        pids.push(pid);
        iods.push(addr);
    }
    let d = dir.join("mds");
    std::fs::create_dir_all(&d)?;
    let mut args = vec![
        "mds".into(),
        "--data".into(),
        s(&d),
        "--listen".into(),
        format!("127.0.0.1:{}", port(0)),
        "--secret-file".into(),
        s(&secret_file),
    ];
    for addr in &iods {
        args.push("--iod".into());
        args.push(addr.clone());
    }
    let (pid, mds) = spawn(&args, &dir.join("mds.log"))?;
    pids.push(pid);
    let mut c = ClusterFile {
        mds,
        iods,
        pids,
        mounts: vec![],
    };
    std::fs::write(cluster_file(dir), serde_json::to_string_pretty(&c)?)?;
    if let Some(mnt) = &a.mount {
        std::fs::create_dir_all(mnt).with_context(|| format!("creating mount point {}", mnt.display()))?;
        let args = vec!["mount".into(), "--data".into(), s(dir), s(mnt)];
        let (pid, _) = spawn_until(&args, &dir.join("mount.log"), "mounted on ")?;
        c.mounts.push((mnt.clone(), pid));
        std::fs::write(cluster_file(dir), serde_json::to_string_pretty(&c)?)?;
        println!("  mounted on {}", mnt.display());
    }
    println!(
        "parcache cluster in {}: metadata server {}, {} data servers",
        dir.display(),
        c.mds,
        c.iods.len()
    );
    println!("  copy in:  parcache cp --data {} ./file pc:/file", dir.display());
    println!("  stop:     parcache down --data {}", dir.display());
    Ok(())
}

pub fn down(a: DataArg) -> Result<()> {
    let c = read_cluster(&a.data)?;
    let secret = Secret::load(&a.data.join("secret"))?;
    // Mounts first: they push their dirty data as they unmount.
    for (mnt, pid) in &c.mounts {
        if !alive(*pid) {
            continue;
        }
        let ok = Command::new("fusermount3").arg("-u").arg(mnt).status();
        if !ok.is_ok_and(|s| s.success()) {
            eprintln!(
                "parcache down: fusermount3 -u {} failed; is something using it?",
                mnt.display()
            );
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while alive(*pid) {
            if std::time::Instant::now() > deadline {
                bail!("the mount on {} (pid {pid}) did not end within 30 s", mnt.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let rt = crate::daemon::runtime()?;
    // The metadata server first, then the data servers (they checkpoint their logs).
    let mut addrs = vec![c.mds.clone()];
    addrs.extend(c.iods.iter().cloned());
    rt.block_on(async {
        for addr in &addrs {
            match Client::connect(addr, &secret).await {
                Ok(cl) => {
                    let _ = cl.call(&Request::Shutdown, &[]).await;
                }
                Err(e) => eprintln!("parcache down: {addr}: {e} (already stopped?)"),
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while c.pids.iter().any(|&p| alive(p)) {
        if std::time::Instant::now() > deadline {
            bail!(
                "servers {:?} did not stop within 30 s",
                c.pids.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("parcache cluster in {} stopped", a.data.display());
    Ok(())
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

pub fn status(a: DataArg) -> Result<()> {
    let c = read_cluster(&a.data)?;
    let secret = Secret::load(&a.data.join("secret"))?;
    let rt = crate::daemon::runtime()?;
    let mut addrs = vec![("mds".to_string(), c.mds.clone())];
    addrs.extend(c.iods.iter().enumerate().map(|(i, a)| (format!("iod {i}"), a.clone())));
    rt.block_on(async {
        println!(
            "{:<7} {:<16} {:>5} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9} {:>9}  policy",
            "server", "address", "state", "size", "free", "log", "hits", "dirty", "immediate", "misses"
        );
        for (name, addr) in addrs {
            let stats = match Client::connect(&addr, &secret).await {
                Ok(cl) => cl.call(&Request::Stats, &[]).await.ok(),
                Err(_) => None,
            };
            match stats {
                Some((Response::Stats(s), _)) => println!(
                    "{:<7} {:<16} {:>5} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9} {:>9}  {}",
                    name,
                    addr,
                    "up",
                    human(s.capacity_bytes),
                    human(s.free_bytes),
                    human(s.log_bytes),
                    s.read_hits,
                    s.dirty_blocks,
                    s.immediate_writes,
                    s.read_misses,
                    s.role
                ),
                _ => println!("{:<7} {:<16} {:>5}", name, addr, "DOWN"),
            }
        }
    });
    Ok(())
}
