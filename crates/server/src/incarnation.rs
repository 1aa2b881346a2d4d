//! A data server's incarnation: a number moved on at each start and kept
//! in its directory with the machine's boot, so that a node that lost its
//! connection can ask whether the server lost writes it had acknowledged
//! and no sync had covered (`Request::Incarnation`).
//!
//! A data server acknowledges a buffered write once it is in the kernel's
//! page cache (its write log or its block store), and makes it durable at
//! the next sync. A crash of the process alone loses none of it (the
//! kernel writes it down); a graceful stop syncs everything first. Only a
//! crash of the machine (a power cut, a reboot without a stop) loses the
//! writes since the last sync: this start then says nothing was kept, and
//! a node's `fsync` of a file written before it fails with `EIO` instead
//! of promising bytes the server no longer has (as NFS's write verifier
//! tells a client to send its uncommitted writes again).

use std::io::{self, Write};
use std::path::Path;

/// The file holding the incarnation and the boot it started in.
const FILE: &str = "incarnation";
/// The file naming the incarnation whose graceful stop came last.
const GRACEFUL: &str = "graceful-stop";
/// Where the kernel names the running boot.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// What a start of a data server knows of itself and of the one before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incarnation {
    /// This start's number (one past the last recorded).
    pub now: u64,
    /// The incarnation before this one, if it lost nothing it had
    /// acknowledged: it stopped gracefully, or it crashed while the
    /// machine stayed up. `None` after a crash of the machine, or when the
    /// directory recorded no earlier start.
    pub kept_all_of: Option<u64>,
}

/// The running boot of this machine: `PARCACHE_BOOT_ID` if set (tests
/// restart a server "after a reboot" with it), else the kernel's boot id;
/// empty if neither can be read (every crash then counts as a reboot).
pub fn boot_id() -> String {
    if let Ok(b) = std::env::var("PARCACHE_BOOT_ID") {
        return b;
    }
    std::fs::read_to_string(BOOT_ID)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Starts a new incarnation in `dir` (made durable before the server
/// answers anyone), judging the one before it by `boot` (see
/// [`boot_id`]) and its graceful-stop record, which is removed.
pub fn begin(dir: &Path, boot: &str) -> io::Result<Incarnation> {
    let before = read(dir);
    let graceful = std::fs::read_to_string(dir.join(GRACEFUL))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let now = before.as_ref().map_or(1, |(n, _)| n + 1);
    let kept_all_of = before
        .filter(|(n, b)| graceful == Some(*n) || (!boot.is_empty() && b == boot))
        .map(|(n, _)| n);
    write_durably(dir, FILE, &format!("{now} {boot}"))?;
    match std::fs::remove_file(dir.join(GRACEFUL)) {
        Ok(()) => std::fs::File::open(dir)?.sync_all()?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(Incarnation { now, kept_all_of })
}

/// Records that incarnation `now` stopped gracefully: everything it
/// acknowledged is durable (called after its last sync).
pub fn stopped_gracefully(dir: &Path, now: u64) -> io::Result<()> {
    write_durably(dir, GRACEFUL, &now.to_string())
}

/// The incarnation recorded in `dir` and its boot; `None` if none is, or
/// the record is damaged (logged: the one before then counts as lost).
fn read(dir: &Path) -> Option<(u64, String)> {
    let p = dir.join(FILE);
    let s = std::fs::read_to_string(&p).ok()?;
    let (n, boot) = s.trim_end().split_once(' ').unwrap_or((s.trim(), ""));
    match n.parse() {
        Ok(n) => Some((n, boot.to_string())),
        Err(_) => {
            tracing::warn!(
                "{} is damaged ({s:?}): counting the last start as a crash of the machine",
                p.display()
            );
            None
        }
    }
}

/// Writes `dir/name` durably: a temporary file, synced, renamed over, and
/// the directory synced.
fn write_durably(dir: &Path, name: &str, line: &str) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(f, "{line}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("parcache-incarnation-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A crash in the same boot and a graceful stop keep everything; a
    /// crash of the machine (another boot, no graceful stop) does not;
    /// the graceful record counts once.
    #[test]
    fn only_a_crash_of_the_machine_loses_what_the_one_before_acknowledged() {
        let d = dir("judge");
        let first = begin(&d, "boot-a").unwrap();
        assert_eq!(
            first,
            Incarnation {
                now: 1,
                kept_all_of: None
            }
        );
        // The process crashed; the machine stayed up.
        let second = begin(&d, "boot-a").unwrap();
        assert_eq!(
            second,
            Incarnation {
                now: 2,
                kept_all_of: Some(1)
            }
        );
        // The machine went down with it.
        let third = begin(&d, "boot-b").unwrap();
        assert_eq!(third.kept_all_of, None);
        // A graceful stop, then a reboot.
        stopped_gracefully(&d, third.now).unwrap();
        let fourth = begin(&d, "boot-c").unwrap();
        assert_eq!(
            fourth,
            Incarnation {
                now: 4,
                kept_all_of: Some(3)
            }
        );
        // Its record was used up: a crash of the machine now loses again.
        let fifth = begin(&d, "boot-d").unwrap();
        assert_eq!(fifth.kept_all_of, None);
        // A stale graceful record (of an older incarnation) does not count.
        stopped_gracefully(&d, 2).unwrap();
        assert_eq!(begin(&d, "boot-e").unwrap().kept_all_of, None);
        // Nor does a boot nobody could read.
        assert_eq!(begin(&d, "").unwrap().kept_all_of, None);
        assert_eq!(begin(&d, "").unwrap().kept_all_of, None);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A damaged record counts the last start as lost, and starts anew.
    #[test]
    fn a_damaged_record_counts_as_a_crash_of_the_machine() {
        let d = dir("damaged");
        std::fs::write(d.join(FILE), "not a number\n").unwrap();
        let i = begin(&d, "boot-a").unwrap();
        assert_eq!(
            i,
            Incarnation {
                now: 1,
                kept_all_of: None
            }
        );
        assert_eq!(begin(&d, "boot-a").unwrap().kept_all_of, Some(1));
        let _ = std::fs::remove_dir_all(&d);
    }
}
