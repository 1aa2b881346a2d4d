//! SeaweedFS, a distributed file system users pick instead of parcache,
//! run on this machine for `mount-io` to measure beside parcache with the
//! same jobs: `weed server` (a master, a volume server and a filer, the
//! project's single-machine set-up) on loopback ports of its own, and
//! `weed mount` (FUSE), all with their defaults. `bench/seaweedfs.sh`
//! builds `weed` from the Go module proxy.

use anyhow::{bail, Context, Result};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the servers and a mount may take to come up.
const START: Duration = Duration::from_secs(60);

/// A running SeaweedFS: its servers, and its mount while mounted.
pub struct Seaweed {
    weed: PathBuf,
    dir: PathBuf,
    /// The filer's HTTP and gRPC ports.
    filer: (u16, u16),
    /// The master's, the volume server's and the filer's gRPC ports.
    grpc: [u16; 3],
    server: Child,
    mount: Option<Child>,
    /// The mount sockets in /tmp before this SeaweedFS started.
    sockets_before: std::collections::HashSet<PathBuf>,
}

impl Seaweed {
    /// Starts `weed server` with its data under `dir` and mounts it at
    /// [`Seaweed::at`], once a file can be written there (the volume
    /// server registers with the master a few seconds after its start).
    pub fn start(weed: &Path, dir: &Path) -> Result<Seaweed> {
        for d in ["data", "cache", "mnt"] {
            std::fs::create_dir_all(dir.join(d))?;
        }
        // Six ports (master, volume server, filer; HTTP and gRPC each),
        // held together while chosen so they differ.
        let held: Vec<TcpListener> = (0..6)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<std::io::Result<_>>()?;
        let ports: Vec<u16> = held
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<std::io::Result<_>>()?;
        drop(held);
        let log = std::fs::File::create(dir.join("server.log"))?;
        let server = Command::new(weed)
            .arg("server")
            .arg(format!("-dir={}", dir.join("data").display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-filer"])
            .arg(format!("-master.port={}", ports[0]))
            .arg(format!("-master.port.grpc={}", ports[1]))
            .arg(format!("-volume.port={}", ports[2]))
            .arg(format!("-volume.port.grpc={}", ports[3]))
            .arg(format!("-filer.port={}", ports[4]))
            .arg(format!("-filer.port.grpc={}", ports[5]))
            .arg(format!("-filer.localSocket={}", dir.join("filer.sock").display()))
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} server", weed.display()))?;
        let mut s = Seaweed {
            weed: weed.to_path_buf(),
            dir: dir.to_path_buf(),
            filer: (ports[4], ports[5]),
            grpc: [ports[1], ports[3], ports[5]],
            sockets_before: mount_sockets(),
            server,
            mount: None,
        };
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", s.filer.0)).is_err() {
            if let Some(status) = s.server.try_wait()? {
                bail!("weed server exited ({status}): {}", last_lines(&dir.join("server.log")));
            }
            if t.elapsed() > START {
                bail!("weed server's filer did not listen within {START:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        s.mount(true)?;
        // Ready once a file written there is durable: a write succeeds
        // before the master has a leader, and its close fails with EIO
        // ("raft.Server: Not current leader"), which a `write` that
        // ignores its close's error never sees. 8 MiB, so that the
        // volume server's first volumes are made before the timed jobs.
        let probe = s.at().join(".probe");
        let t = Instant::now();
        while let Err(e) = durable_write(&probe, &[7u8; 8 << 20]) {
            if t.elapsed() > START {
                bail!("cannot write a file durably to SeaweedFS's mount within {START:?}: {e}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        std::fs::remove_file(&probe)?;
        Ok(s)
    }

    /// Where it is mounted.
    pub fn at(&self) -> PathBuf {
        self.dir.join("mnt")
    }

    /// Mounts it anew, its chunk cache (memory and `-cacheDir`) empty: the
    /// node's caches gone, as parcache's remount empties its node cache.
    /// `cold`: the page cache dropped too, so the volume server reads its
    /// disk.
    pub fn remount(&mut self, cold: bool) -> Result<()> {
        self.unmount()?;
        std::fs::remove_dir_all(self.dir.join("cache"))?;
        std::fs::create_dir_all(self.dir.join("cache"))?;
        self.mount(cold)
    }

    fn mount(&mut self, cold: bool) -> Result<()> {
        if cold {
            crate::drop_caches();
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("mount.log"))?;
        let child = Command::new(&self.weed)
            .arg("mount")
            // Its gRPC port after a dot: otherwise the mount takes the
            // HTTP port's plus 10,000.
            .arg(format!("-filer=127.0.0.1:{}.{}", self.filer.0, self.filer.1))
            .arg(format!("-dir={}", self.at().display()))
            .arg(format!("-cacheDir={}", self.dir.join("cache").display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} mount", self.weed.display()))?;
        self.mount = Some(child);
        let t = Instant::now();
        while !crate::mounted(&self.at()) {
            if let Some(status) = self.mount.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!(
                    "weed mount exited ({status}): {}",
                    last_lines(&self.dir.join("mount.log"))
                );
            }
            if t.elapsed() > START {
                bail!("weed mount did not mount {} within {START:?}", self.at().display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn unmount(&mut self) -> Result<()> {
        let Some(mut child) = self.mount.take() else {
            return Ok(());
        };
        let _ = Command::new("fusermount3").arg("-u").arg(self.at()).status();
        let t = Instant::now();
        while child.try_wait()?.is_none() {
            if t.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                let _ = Command::new("fusermount3").arg("-uz").arg(self.at()).status();
                child.wait()?;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

/// Writes `data` to a new file at `path` and syncs it, every error seen.
fn durable_write(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// The last lines of a log, for an error (the bench removes the log).
fn last_lines(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" / ");
    if tail.is_empty() {
        "its log is empty".to_string()
    } else {
        format!("its log ends: {tail}")
    }
}

/// Sockets `weed` leaves in /tmp whatever its flags say (named by a
/// server's gRPC port, or by a mount's hash).
fn mount_sockets() -> std::collections::HashSet<PathBuf> {
    std::fs::read_dir("/tmp")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("seaweedfs-mount-") && n.ends_with(".sock"))
        })
        .collect()
}

impl Drop for Seaweed {
    fn drop(&mut self) {
        let now = mount_sockets();
        let _ = self.unmount();
        let _ = self.server.kill();
        let _ = self.server.wait();
        // What it left in /tmp: its servers' sockets by their ports, and
        // the mount sockets that were not there when this one started.
        for (kind, port) in ["master", "volume", "filer"].into_iter().zip(self.grpc) {
            let _ = std::fs::remove_file(format!("/tmp/seaweedfs-{kind}-grpc-{port}.sock"));
        }
        for p in now.difference(&self.sockets_before) {
            let _ = std::fs::remove_file(p);
        }
    }
}
