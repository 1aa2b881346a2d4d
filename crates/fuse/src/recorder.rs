//! `parcache mount --record FILE`: every open, read, write, fsync and
//! close that reaches the mount, written as parcache's trace records
//! (`parcache_core::TraceRecord`, one JSON object per line) so that
//! `parcache sim replay` and `parcache advise` can replay a real run under
//! other policies (docs/advisor.md).
//!
//! A mount is one node (its cache is one node cache): the node is named
//! `HOST/PID` of the mount process, the process is the caller's pid as
//! FUSE gives it at open (later requests on the same open file, its
//! release above all, often come from the kernel with pid 0). Times are seconds since the Unix epoch, so the traces of
//! several mounts (nodes) merge by concatenation (`cat a.jsonl b.jsonl`). Reads the kernel's page cache answers never reach the
//! mount and are not recorded. Recording never fails a file operation: if
//! the trace file cannot be written (a full disk) the mount says so once
//! in its log and stops recording.

use parcache_core::{TraceOp, TraceRecord};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The trace being written.
pub struct Recorder {
    start: Instant,
    /// `start` as seconds since the Unix epoch.
    epoch: f64,
    node: String,
    out: Mutex<BufWriter<File>>,
    /// Paths of the files and directories seen, by inode.
    names: Mutex<HashMap<u64, String>>,
    failed: AtomicBool,
    /// The process that opened each open file, by the handle given it.
    openers: Mutex<HashMap<u64, u32>>,
    next_fh: AtomicU64,
}

/// The root directory's inode.
const ROOT: u64 = 1;

impl Recorder {
    /// Starts a trace at `path`, which must not exist yet (a trace already
    /// there is somebody's recording).
    pub fn create(path: &Path, node: String) -> std::io::Result<Recorder> {
        let f = std::fs::OpenOptions::new().write(true).create_new(true).open(path)?;
        let epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        Ok(Recorder {
            start: Instant::now(),
            epoch,
            node,
            out: Mutex::new(BufWriter::with_capacity(1 << 16, f)),
            names: Mutex::new(HashMap::from([(ROOT, String::new())])),
            failed: AtomicBool::new(false),
            openers: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        })
    }

    /// Notes that `name` in directory `parent` is inode `ino`.
    pub fn learn(&self, parent: u64, name: &[u8], ino: u64) {
        let mut names = self.names.lock();
        let dir = names
            .get(&parent)
            .cloned()
            .unwrap_or_else(|| format!("/inode-{parent}"));
        names.insert(ino, format!("{dir}/{}", String::from_utf8_lossy(name)));
    }

    /// A handle for a file `pid` opens (FUSE hands it back with every
    /// request on that open file).
    pub fn opened(&self, pid: u32) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.openers.lock().insert(fh, pid);
        fh
    }

    /// The process that opened handle `fh`, or `pid` if it is unknown.
    pub fn opener(&self, fh: u64, pid: u32) -> u32 {
        self.openers.lock().get(&fh).copied().unwrap_or(pid)
    }

    /// Forgets handle `fh` (released); its opener, or `pid`.
    pub fn closed(&self, fh: u64, pid: u32) -> u32 {
        self.openers.lock().remove(&fh).unwrap_or(pid)
    }

    /// The path an inode was last seen under.
    fn path(&self, ino: u64) -> String {
        self.names
            .lock()
            .get(&ino)
            .cloned()
            .unwrap_or_else(|| format!("/inode-{ino}"))
    }

    /// Writes one operation that began at `began`, is done now, and came
    /// from process `pid`.
    pub fn log(&self, began: Instant, pid: u32, ino: u64, op: TraceOp, offset: u64, length: u64) {
        if self.failed.load(Ordering::Relaxed) {
            return;
        }
        let r = TraceRecord {
            time: self.epoch + began.saturating_duration_since(self.start).as_secs_f64(),
            node: self.node.clone(),
            process: u64::from(pid),
            file: self.path(ino),
            op,
            offset,
            length,
            duration: began.elapsed().as_secs_f64(),
        };
        let mut line = serde_json::to_vec(&r).expect("a trace record serialises");
        line.push(b'\n');
        let mut out = self.out.lock();
        let mut r = out.write_all(&line);
        // A close or fsync ends a step of the program: what it did so far
        // reaches the trace file, so a killed run leaves a usable trace.
        if r.is_ok() && matches!(op, TraceOp::Close | TraceOp::Fsync) {
            r = out.flush();
        }
        if let Err(e) = r {
            self.failed.store(true, Ordering::Relaxed);
            tracing::error!("--record: writing the trace failed ({e}); recording stopped, the mount goes on");
        }
    }

    /// Writes out what is buffered (at unmount).
    pub fn flush(&self) {
        if let Err(e) = self.out.lock().flush() {
            tracing::error!("--record: writing the trace failed at unmount: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_the_replay_format_with_paths() {
        let dir = std::env::temp_dir().join(format!("parcache-rec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.jsonl");
        let _ = std::fs::remove_file(&p);
        let r = Recorder::create(&p, "h/1".into()).unwrap();
        assert!(
            Recorder::create(&p, "h/1".into()).is_err(),
            "an existing trace is not overwritten"
        );
        r.learn(ROOT, b"d", 5);
        let fh = r.opened(42);
        assert_eq!(r.opener(fh, 0), 42);
        assert_eq!(r.closed(fh, 0), 42);
        assert_eq!(r.closed(fh, 7), 7, "a handle is forgotten at release");
        r.learn(5, b"f\xff", 9);
        let t = Instant::now();
        r.log(t, 42, 9, TraceOp::Open, 0, 1);
        r.log(t, 42, 9, TraceOp::Write, 0, 4096);
        r.log(t, 42, 77, TraceOp::Close, 0, 0);
        drop(r);
        let text = std::fs::read_to_string(&p).unwrap();
        let recs: Vec<TraceRecord> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(recs.len(), 3);
        assert_eq!(recs[1].file, "/d/f\u{fffd}");
        assert_eq!(recs[1].op, TraceOp::Write);
        assert_eq!((recs[1].length, recs[1].process), (4096, 42));
        assert_eq!(recs[2].file, "/inode-77");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
