//! One process per directory: a lock file held while a server or a node's
//! durable write cache uses the directory, which only its owner may read.

/// Takes the exclusive lock on a daemon's data directory (`DIR/lock`,
/// flock) for as long as the returned file is open: a second daemon on the
/// same directory (a hand-started one, or an orphan of a failed `up`)
/// would replay, checkpoint and empty the same log, losing data.
///
/// The directory is made its owner's alone ([`keep_private`]).
pub fn lock_dir(dir: &std::path::Path, what: &str) -> std::io::Result<std::fs::File> {
    use rustix::fs::{flock, FlockOperation};
    std::fs::create_dir_all(dir)?;
    keep_private(dir, what);
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

/// Takes group's and others' access to `dir` away: what it holds (a data
/// server's parts and log, a metadata server's copies of small files, a
/// node's durable write cache) is what clients wrote, and a local user
/// without the cluster secret could read it all where the umask left the
/// directory readable (0755 under the usual 022). The owner's own bits
/// stay as they are. A directory this process may not change (another
/// user's) is left as it is, with a warning.
fn keep_private(dir: &std::path::Path, what: &str) {
    use std::os::unix::fs::PermissionsExt;
    let mode = match std::fs::metadata(dir) {
        Ok(m) => m.permissions().mode(),
        Err(e) => return tracing::warn!("{}: {e}", dir.display()),
    };
    if mode & 0o077 == 0 {
        return;
    }
    if let Err(e) = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o7700)) {
        tracing::warn!(
            "the {what}'s directory {} stays readable by others ({:o}): {e}",
            dir.display(),
            mode & 0o777
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &std::path::Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    /// A directory made by the usual umask, or made open by hand, is its
    /// owner's alone once a daemon locks it; a new one is made so.
    #[test]
    fn a_locked_directory_is_its_owners_alone() {
        let base = std::env::temp_dir().join(format!("parcache-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let open = base.join("open");
        std::fs::create_dir_all(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let _l = lock_dir(&open, "test").unwrap();
        assert_eq!(mode(&open), 0o700);
        let fresh = base.join("a/b");
        let _m = lock_dir(&fresh, "test").unwrap();
        assert_eq!(mode(&fresh) & 0o077, 0);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
