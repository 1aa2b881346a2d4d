//! One process per directory: a lock file held while a server or a node's
//! durable write cache uses the directory.

/// Takes the exclusive lock on a daemon's data directory (`DIR/lock`,
/// flock) for as long as the returned file is open: a second daemon on the
/// same directory (a hand-started one, or an orphan of a failed `up`)
/// would replay, checkpoint and empty the same log, losing data.
pub fn lock_dir(dir: &std::path::Path, what: &str) -> std::io::Result<std::fs::File> {
    use rustix::fs::{flock, FlockOperation};
    std::fs::create_dir_all(dir)?;
    let path = dir.join("lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)?;
    // A predecessor killed a moment ago may still be exiting (in the middle
    // of an fsync, say): give it a few seconds to let go.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match flock(&f, FlockOperation::NonBlockingLockExclusive) {
            Err(rustix::io::Errno::WOULDBLOCK) if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            r => break lock_result(r, f, dir, &path, what),
        }
    }
}

fn lock_result(
    r: rustix::io::Result<()>,
    f: std::fs::File,
    dir: &std::path::Path,
    path: &std::path::Path,
    what: &str,
) -> std::io::Result<std::fs::File> {
    match r {
        Ok(()) => Ok(f),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!(
                "another {what} is already running on {} (it holds the lock {})",
                dir.display(),
                path.display()
            ),
        )),
        Err(e) => Err(std::io::Error::from(e)),
    }
}
