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

use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The file holding the incarnation, the boot it started in, and whether
/// it stopped gracefully: one fixed-width line, rewritten in place (no
/// new file, so a restart on a full disk can record itself; a torn
/// rewrite reads as damaged, which only counts as a crash of the machine).
const FILE: &str = "incarnation";
/// Where the kernel names the running boot.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// The record's width: a number, a boot id (36 characters from the
/// kernel) and the flag fit; a longer boot id makes the line longer.
const WIDTH: usize = 80;

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
/// [`boot_id`]) and whether it recorded a graceful stop.
pub fn begin(dir: &Path, boot: &str) -> io::Result<Incarnation> {
    let before = read(dir);
    let now = before.as_ref().map_or(1, |r| r.now + 1);
    let kept_all_of = before
        .filter(|r| r.graceful || (!boot.is_empty() && r.boot == boot))
        .map(|r| r.now);
    record(dir, now, boot, false)?;
    Ok(Incarnation { now, kept_all_of })
}

/// Records that incarnation `now`, started in `boot`, stopped gracefully:
/// everything it acknowledged is durable (called after its last sync).
pub fn stopped_gracefully(dir: &Path, now: u64, boot: &str) -> io::Result<()> {
    record(dir, now, boot, true)
}

/// One incarnation as its directory recorded it.
struct Record {
    now: u64,
    boot: String,
    graceful: bool,
}

/// The incarnation recorded in `dir`; `None` if none is, or the record
/// is damaged (logged: the one before then counts as lost).
fn read(dir: &Path) -> Option<Record> {
    let p = dir.join(FILE);
    let s = std::fs::read_to_string(&p).ok()?;
    let mut w = s.split_whitespace();
    let parsed = (|| {
        let now = w.next()?.parse().ok()?;
        let graceful = match w.next()? {
            "stopped" => true,
            "running" => false,
            _ => return None,
        };
        Some(Record {
            now,
            graceful,
            boot: w.next().unwrap_or("").to_string(),
        })
    })();
    if parsed.is_none() {
        tracing::warn!(
            "{} is damaged ({s:?}): counting the last start as a crash of the machine",
            p.display()
        );
    }
    parsed
}

/// Writes the record in place, padded to [`WIDTH`], and syncs it (the
/// first start creates the file, and syncs the directory too).
fn record(dir: &Path, now: u64, boot: &str, graceful: bool) -> io::Result<()> {
    let p = dir.join(FILE);
    let state = if graceful { "stopped" } else { "running" };
    let line = format!("{now} {state} {boot}");
    let line = format!("{line:<width$}\n", width = WIDTH - 1);
    let named = |e: io::Error| io::Error::new(e.kind(), format!("recording this start in {}: {e}", p.display()));
    let created = !p.exists();
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&p)
        .map_err(named)?;
    f.write_all_at(line.as_bytes(), 0).map_err(named)?;
    if f.metadata().map_err(named)?.len() > line.len() as u64 {
        f.set_len(line.len() as u64).map_err(named)?;
    }
    f.sync_all().map_err(named)?;
    if created {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(named)?;
    }
    Ok(())
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
        stopped_gracefully(&d, third.now, "boot-b").unwrap();
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
        // Nor does a boot nobody could read.
        assert_eq!(begin(&d, "").unwrap().kept_all_of, None);
        assert_eq!(begin(&d, "").unwrap().kept_all_of, None);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The record is one line rewritten in place, its width fixed unless a
    /// boot id is too long for it (then it shrinks back after).
    #[test]
    fn the_record_is_rewritten_in_place() {
        let d = dir("in-place");
        let long = "b".repeat(200);
        begin(&d, &long).unwrap();
        assert!(std::fs::metadata(d.join(FILE)).unwrap().len() > WIDTH as u64);
        assert_eq!(begin(&d, "short").unwrap().kept_all_of, None);
        assert_eq!(std::fs::metadata(d.join(FILE)).unwrap().len(), WIDTH as u64);
        let i = begin(&d, "short").unwrap();
        assert_eq!(
            i,
            Incarnation {
                now: 3,
                kept_all_of: Some(2)
            }
        );
        stopped_gracefully(&d, 3, "short").unwrap();
        assert_eq!(std::fs::metadata(d.join(FILE)).unwrap().len(), WIDTH as u64);
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
