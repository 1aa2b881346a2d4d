//! `parcache mount`: the cluster as a FUSE file system on this node.

use crate::fs::Target;
use anyhow::{bail, Context, Result};
use clap::Args;
use parcache_fuse::Mount;
use std::path::PathBuf;

#[derive(Args)]
pub struct MountArgs {
    /// Where to mount (an existing, empty directory).
    mountpoint: PathBuf,
    #[command(flatten)]
    target: Target,
}

/// Whether `dir` is a mount point right now (from /proc/mounts).
pub fn is_mounted(dir: &std::path::Path) -> bool {
    let Ok(dir) = dir.canonicalize() else { return false };
    std::fs::read_to_string("/proc/mounts")
        .map(|m| {
            m.lines()
                .any(|l| l.split(' ').nth(1) == Some(dir.to_str().unwrap_or("")))
        })
        .unwrap_or(false)
}

/// Mounts and serves in the foreground until the mount is unmounted
/// (`fusermount3 -u MNT`, `umount MNT`) or the process gets SIGINT or
/// SIGTERM; pushes every dirty block before it exits.
pub fn mount(a: MountArgs) -> Result<()> {
    crate::daemon::logging();
    if !a.mountpoint.is_dir() {
        bail!("mount point {} is not a directory", a.mountpoint.display());
    }
    if is_mounted(&a.mountpoint) {
        bail!("{} is already a mount point", a.mountpoint.display());
    }
    if !std::path::Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse is missing: this machine cannot mount FUSE file systems (scripts/setup.sh installs fuse3)");
    }
    let rt = crate::daemon::runtime()?;
    let fs = rt.block_on(a.target.connect())?;
    let session = Mount::new(fs.clone(), rt.handle().clone())
        .spawn(&a.mountpoint)
        .with_context(|| format!("mounting {} (is fusermount3 installed?)", a.mountpoint.display()))?;
    println!("mounted on {}", a.mountpoint.display());
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
    rt.block_on(fs.shutdown())?;
    Ok(())
}
