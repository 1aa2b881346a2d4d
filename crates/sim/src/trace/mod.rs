//! Real I/O traces, read into one form for replay (`parcache sim replay`,
//! docs/advisor.md): a list of operations, each with its time, node,
//! process, file, kind, bytes and duration, in time order.
//!
//! Formats, told apart by their first bytes ([`Format::detect`]):
//! - [`records`]: parcache's own CSV or JSONL (`mount --record` writes it);
//! - [`darshan`]: Darshan logs with DXT tracing, parsed directly;
//! - [`block_traces`]: block-level traces without files or opens (the
//!   Sprite-derived LIRS trace, MSR Cambridge and Tencent cloud CSVs).
//!
//! Traces without opens and closes get one session per process and file
//! (open before its first access, close after its last), so the replay's
//! consistency plug-ins see sessions in every format.

pub mod block_traces;
pub mod darshan;
pub mod records;

use parcache_core::TraceOp;
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;

/// One operation of a trace. Times are seconds from the trace's start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Op {
    pub time: f64,
    /// How long it took when recorded (0 if unknown).
    pub duration: f64,
    /// Index into [`Trace::nodes`].
    pub node: u32,
    /// The process, unique within its node.
    pub process: u64,
    /// Index into [`Trace::files`].
    pub file: u32,
    pub kind: TraceOp,
    pub offset: u64,
    /// Bytes; for an open, 1 if opened for writing.
    pub length: u64,
}

/// A trace in memory.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub format: Option<Format>,
    pub files: Vec<String>,
    pub nodes: Vec<String>,
    /// In time order (ties keep the order read).
    pub ops: Vec<Op>,
    /// What the reader had to assume or leave out, for the user.
    pub notes: Vec<String>,
}

/// The formats read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// parcache's records, as CSV.
    Csv,
    /// parcache's records, one JSON object per line.
    Jsonl,
    /// A Darshan log with DXT (per-operation) records.
    Darshan,
    /// One decimal block id per line (the LIRS trace set's Sprite trace).
    BlockIds,
    /// MSR Cambridge: FILETIME, host, disk, Read/Write, offset, size, response.
    MsrCambridge,
    /// Tencent cloud block storage: seconds, sector offset, sectors, 0/1, volume.
    TencentCloud,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Csv => "parcache CSV",
            Format::Jsonl => "parcache JSONL",
            Format::Darshan => "Darshan DXT",
            Format::BlockIds => "block ids (LIRS/Sprite)",
            Format::MsrCambridge => "MSR Cambridge CSV",
            Format::TencentCloud => "Tencent cloud block CSV",
        }
    }

    /// The format of decompressed text, from its first line.
    fn detect_text(first: &str) -> Option<Format> {
        let first = first.trim();
        if first.starts_with('{') {
            return Some(Format::Jsonl);
        }
        if first.starts_with("time,") {
            return Some(Format::Csv);
        }
        let fields: Vec<&str> = first.split(',').map(str::trim).collect();
        let num = |s: &str| s.parse::<u64>().is_ok();
        match fields.len() {
            1 if num(fields[0]) => Some(Format::BlockIds),
            7 if num(fields[0]) && matches!(fields[3], "Read" | "Write") => Some(Format::MsrCambridge),
            5 if fields.iter().all(|f| num(f)) => Some(Format::TencentCloud),
            _ => None,
        }
    }
}

/// Why a trace could not be read. Every message names the file and, where
/// it can, the line or record at fault.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The I/O error is said in the message, not kept as the source,
    /// which a chain of causes would say a second time.
    #[error("{path}: {err}")]
    Io { path: String, err: std::io::Error },
    #[error("{path}: not a trace parcache reads (first line: {first:?}); known formats: parcache CSV (header '{header}'), JSONL, Darshan DXT logs, block-id lists, MSR Cambridge and Tencent cloud CSVs")]
    Unknown {
        path: String,
        first: String,
        header: &'static str,
    },
    #[error("{path}: line {line}: {detail}")]
    Line { path: String, line: usize, detail: String },
    #[error("{path}: {detail}")]
    Bad { path: String, detail: String },
    #[error("{path}: the trace has no read or write operations")]
    Empty { path: String },
}

/// Reads the trace at `path`, whatever its format (gzip and bzip2 text is
/// decompressed first).
pub fn load(path: &Path) -> Result<Trace, TraceError> {
    let shown = path.display().to_string();
    let io = |err| TraceError::Io {
        path: shown.clone(),
        err,
    };
    let raw = std::fs::read(path).map_err(io)?;
    let mut trace = if darshan::is_darshan(&raw) {
        darshan::parse(&raw).map_err(|detail| TraceError::Bad {
            path: shown.clone(),
            detail,
        })?
    } else {
        let text = decompress(&raw).map_err(io)?;
        let text = String::from_utf8(text).map_err(|e| TraceError::Bad {
            path: shown.clone(),
            detail: format!(
                "not UTF-8 text (byte {}) and not a Darshan log",
                e.utf8_error().valid_up_to()
            ),
        })?;
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        let format = Format::detect_text(first).ok_or_else(|| TraceError::Unknown {
            path: shown.clone(),
            first: first.chars().take(80).collect(),
            header: parcache_core::trace::CSV_HEADER,
        })?;
        let line_err = |(line, detail)| TraceError::Line {
            path: shown.clone(),
            line,
            detail,
        };
        match format {
            Format::Csv => records::parse_csv(&text).map_err(line_err)?,
            Format::Jsonl => records::parse_jsonl(&text).map_err(line_err)?,
            Format::BlockIds => block_traces::block_ids(&text).map_err(line_err)?,
            Format::MsrCambridge => block_traces::msr(&text).map_err(line_err)?,
            Format::TencentCloud => block_traces::tencent(&text).map_err(line_err)?,
            Format::Darshan => unreachable!("Darshan logs are binary"),
        }
    };
    if !trace
        .ops
        .iter()
        .any(|o| matches!(o.kind, TraceOp::Read | TraceOp::Write))
    {
        return Err(TraceError::Empty { path: shown });
    }
    trace.finish();
    Ok(trace)
}

fn decompress(raw: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    if raw.starts_with(&[0x1f, 0x8b]) {
        flate2::read::MultiGzDecoder::new(raw).read_to_end(&mut out)?;
    } else if raw.starts_with(b"BZh") {
        bzip2::read::MultiBzDecoder::new(raw).read_to_end(&mut out)?;
    } else {
        out.extend_from_slice(raw);
    }
    Ok(out)
}

/// Interns names as indices.
#[derive(Default)]
pub(crate) struct Names {
    pub list: Vec<String>,
    index: HashMap<String, u32>,
}

impl Names {
    pub fn id(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        let i = self.list.len() as u32;
        self.list.push(name.to_string());
        self.index.insert(name.to_string(), i);
        i
    }
}

impl Trace {
    /// Sorts by time (stably), starts the clock at the first operation,
    /// and gives every (node, process, file) without an open a session
    /// around its accesses.
    pub(crate) fn finish(&mut self) {
        self.ops.sort_by(|a, b| a.time.total_cmp(&b.time));
        let t0 = self.ops.first().map_or(0.0, |o| o.time);
        for o in &mut self.ops {
            o.time -= t0;
        }
        // (node, process, file) -> (index of first access, of last, writes?)
        let mut open: HashMap<(u32, u64, u32), bool> = HashMap::new();
        let mut span: BTreeMap<(u32, u64, u32), (usize, usize, bool)> = BTreeMap::new();
        for (i, o) in self.ops.iter().enumerate() {
            let k = (o.node, o.process, o.file);
            match o.kind {
                TraceOp::Open => {
                    open.insert(k, true);
                }
                TraceOp::Read | TraceOp::Write | TraceOp::Fsync => {
                    let e = span.entry(k).or_insert((i, i, false));
                    e.1 = i;
                    e.2 |= o.kind == TraceOp::Write;
                }
                TraceOp::Close => {}
            }
        }
        let missing: Vec<_> = span.into_iter().filter(|(k, _)| !open.contains_key(k)).collect();
        if missing.is_empty() {
            return;
        }
        self.notes.push(format!(
            "{} process-file pairs had no open: each got one session (open before its first access, close after its last)",
            missing.len()
        ));
        let mut before: HashMap<usize, Vec<Op>> = HashMap::new();
        let mut after: HashMap<usize, Vec<Op>> = HashMap::new();
        for ((node, process, file), (first, last, writes)) in missing {
            let f = self.ops[first];
            let l = self.ops[last];
            let base = Op {
                node,
                process,
                file,
                offset: 0,
                duration: 0.0,
                ..f
            };
            before.entry(first).or_default().push(Op {
                kind: TraceOp::Open,
                length: u64::from(writes),
                ..base
            });
            after.entry(last).or_default().push(Op {
                kind: TraceOp::Close,
                time: l.time + l.duration,
                length: 0,
                ..base
            });
        }
        let mut out = Vec::with_capacity(self.ops.len() + before.len() + after.len());
        for (i, o) in self.ops.iter().enumerate() {
            out.extend(before.remove(&i).unwrap_or_default());
            out.push(*o);
            out.extend(after.remove(&i).unwrap_or_default());
        }
        // A close lands at its last access's end: in time order again
        // (stable: an open stays before the access it precedes).
        out.sort_by(|a, b| a.time.total_cmp(&b.time));
        self.ops = out;
    }

    /// The operations that start in `[start, end)` seconds, as a trace of
    /// their own (its clock starting at its first operation). A process's
    /// session on a file cut by the window's start becomes one session
    /// around its accesses in the window.
    pub fn window(&self, start: f64, end: f64) -> Trace {
        let kept: Vec<Op> = self
            .ops
            .iter()
            .filter(|o| o.time >= start && o.time < end)
            .copied()
            .collect();
        let mut first: HashMap<(u32, u64, u32), TraceOp> = HashMap::new();
        for o in &kept {
            first.entry((o.node, o.process, o.file)).or_insert(o.kind);
        }
        let ops = kept
            .into_iter()
            .filter(|o| {
                !matches!(o.kind, TraceOp::Open | TraceOp::Close)
                    || first[&(o.node, o.process, o.file)] == TraceOp::Open
            })
            .collect();
        let mut t = Trace {
            format: self.format,
            files: self.files.clone(),
            nodes: self.nodes.clone(),
            ops,
            notes: self.notes.clone(),
        };
        t.notes.push(format!(
            "only the operations that start from {start} s to {end} s are replayed"
        ));
        t.finish();
        t
    }

    /// The trace at a glance.
    pub fn summary(&self) -> Summary {
        let mut s = Summary {
            ops: self.ops.len(),
            files: self.files.len(),
            nodes: self.nodes.len(),
            ..Summary::default()
        };
        let mut procs = std::collections::HashSet::new();
        let mut writers: HashMap<u32, std::collections::BTreeSet<u32>> = HashMap::new();
        let mut users: HashMap<u32, std::collections::BTreeSet<u32>> = HashMap::new();
        for o in &self.ops {
            procs.insert((o.node, o.process));
            match o.kind {
                TraceOp::Read => {
                    s.reads += 1;
                    s.read_bytes += o.length;
                    users.entry(o.file).or_default().insert(o.node);
                }
                TraceOp::Write => {
                    s.writes += 1;
                    s.write_bytes += o.length;
                    users.entry(o.file).or_default().insert(o.node);
                    writers.entry(o.file).or_default().insert(o.node);
                }
                _ => {}
            }
            s.span = s.span.max(o.time + o.duration);
        }
        s.processes = procs.len();
        s.write_shared_files = users
            .iter()
            .filter(|(f, u)| u.len() > 1 && writers.get(f).is_some_and(|w| !w.is_empty()))
            .count();
        s
    }
}

/// Counts of a trace (`parcache sim replay` prints them first).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Summary {
    pub ops: usize,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub files: usize,
    pub nodes: usize,
    pub processes: usize,
    /// Files written by one node and read or written by another.
    pub write_shared_files: usize,
    /// Seconds from the first operation's start to the last one's end.
    pub span: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_told_apart_by_their_first_line() {
        assert_eq!(Format::detect_text("{\"time\":0}"), Some(Format::Jsonl));
        assert_eq!(Format::detect_text(parcache_core::trace::CSV_HEADER), Some(Format::Csv));
        assert_eq!(Format::detect_text("1234"), Some(Format::BlockIds));
        assert_eq!(
            Format::detect_text("128166385295514663,hm,0,Write,9056014336,2048,2833"),
            Some(Format::MsrCambridge)
        );
        assert_eq!(
            Format::detect_text("1538323200,4247200,128,1,1058"),
            Some(Format::TencentCloud)
        );
        assert_eq!(Format::detect_text("hello, world"), None);
    }

    #[test]
    fn an_unknown_file_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("parcache-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("notes.txt");
        std::fs::write(&p, "hello, world\n").unwrap();
        let e = load(&p).unwrap_err().to_string();
        assert!(e.contains("notes.txt") && e.contains("not a trace"), "{e}");
        std::fs::write(&p, [0xff, 0xfe, 0x00]).unwrap();
        let e = load(&p).unwrap_err().to_string();
        assert!(e.contains("not UTF-8"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_window_keeps_its_operations_and_mends_cut_sessions() {
        let csv = format!(
            "{}\n0,a,1,/f,open,0,1,0\n1,a,1,/f,write,0,10,0\n5,a,1,/f,write,10,10,0\n6,a,1,/f,close,0,0,0\n\
             7,a,1,/g,open,0,0,0\n8,a,1,/g,read,0,10,0\n9,a,1,/g,close,0,0,0\n",
            parcache_core::trace::CSV_HEADER
        );
        let mut t = records::parse_csv(&csv).unwrap();
        t.finish();
        let w = t.window(4.0, 8.5);
        let kinds: Vec<(TraceOp, f64)> = w.ops.iter().map(|o| (o.kind, o.time)).collect();
        // /f's session began before the window: one session around its
        // write in it; /g's own open and read stay, its close is cut off.
        assert_eq!(
            kinds,
            vec![
                (TraceOp::Open, 0.0),
                (TraceOp::Write, 0.0),
                (TraceOp::Close, 0.0),
                (TraceOp::Open, 2.0),
                (TraceOp::Read, 3.0)
            ]
        );
        assert!(w.notes.iter().any(|n| n.contains("from 4 s to 8.5 s")), "{:?}", w.notes);
    }
}
