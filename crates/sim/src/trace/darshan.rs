//! Darshan logs with DXT, parsed directly rather than through pydarshan:
//! `parcache sim replay` then needs no Python, and a 277k-segment log
//! reads in a fraction of a second.
//!
//! The layout read (darshan-util's `darshan-log-format.h` and
//! `darshan-dxt-log-format.h`, log versions 3.1x to 3.2x and later ones
//! that kept it), little-endian:
//! - a header: an 8-byte version string, the magic number 6567223, the
//!   compression (0 zlib, 1 bzip2, 2 none), a partial flag per module, the
//!   name-record region's offset and length, then an (offset, length) map
//!   of each module's region and each module's version;
//! - the name records: (record id u64, NUL-terminated path) pairs;
//! - the DXT_POSIX module's region (module 9 since 3.2, 8 before): one
//!   compressed stream per rank, each a run of file records — record id,
//!   rank, shared flag, 64-byte host name, write count, read count — each
//!   followed by its write segments and then its read segments (offset,
//!   length, start and end seconds from the job's start).
//!
//! A node is a host name and a process a rank. DXT records no opens or
//! closes: the trace gets one session per rank and file (see `super`).

use super::{Names, Op, Trace};
use parcache_core::TraceOp;
use std::io::Read;

const MAGIC: i64 = 6_567_223;
const RECORD: usize = 104;
const SEGMENT: usize = 32;

/// Whether `raw` starts like a Darshan log.
pub fn is_darshan(raw: &[u8]) -> bool {
    raw.len() >= 16 && raw.starts_with(b"3.") && {
        let m = i64::from_le_bytes(raw[8..16].try_into().expect("8 bytes"));
        m == MAGIC || m.swap_bytes() == MAGIC
    }
}

fn u64_at(raw: &[u8], at: usize) -> Result<u64, String> {
    raw.get(at..at + 8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or_else(|| format!("truncated at byte {at}"))
}

fn f64_at(raw: &[u8], at: usize) -> Result<f64, String> {
    u64_at(raw, at).map(f64::from_bits)
}

/// A region of the log: (offset, length).
type Region = (u64, u64);

struct Header {
    version: String,
    comp: u8,
    partial: u32,
    names: Region,
    modules: Vec<Region>,
}

fn header(raw: &[u8]) -> Result<Header, String> {
    let version = String::from_utf8_lossy(&raw[..8]).trim_end_matches('\0').to_string();
    if i64::from_le_bytes(raw[8..16].try_into().expect("8 bytes")) != MAGIC {
        return Err(format!(
            "Darshan log {version} is big-endian; parcache reads little-endian logs (convert it with darshan-convert)"
        ));
    }
    let comp = *raw.get(16).ok_or("truncated header")?;
    let partial = u32::from_le_bytes(raw.get(20..24).ok_or("truncated header")?.try_into().expect("4 bytes"));
    let names = (u64_at(raw, 24)?, u64_at(raw, 32)?);
    // The module map has 16 entries up to 3.3 and 64 after; the right
    // count is the one whose header ends before the first region.
    for max_mods in [16usize, 64] {
        let end = 40 + max_mods * 16 + max_mods * 4;
        if names.0 < end as u64 {
            continue;
        }
        let Ok(modules) = (0..max_mods)
            .map(|i| Ok((u64_at(raw, 40 + i * 16)?, u64_at(raw, 48 + i * 16)?)))
            .collect::<Result<Vec<_>, String>>()
        else {
            continue;
        };
        let inside =
            |(o, l): Region| l == 0 || (o >= end as u64 && o.checked_add(l).is_some_and(|e| e <= raw.len() as u64));
        if inside(names) && modules.iter().all(|&m| inside(m)) {
            return Ok(Header {
                version,
                comp,
                partial,
                names,
                modules,
            });
        }
    }
    Err(format!("Darshan log {version}: its header's regions do not fit the file (truncated, or a layout parcache does not know)"))
}

/// Decompresses a region: one or more streams back to back.
fn inflate(raw: &[u8], (off, len): Region, comp: u8) -> Result<Vec<u8>, String> {
    let mut rest = &raw[off as usize..(off + len) as usize];
    let mut out = Vec::new();
    while rest.iter().any(|&b| b != 0) {
        let used = match comp {
            0 => {
                let mut d = flate2::bufread::ZlibDecoder::new(rest);
                d.read_to_end(&mut out)
                    .map_err(|e| format!("zlib region at byte {off}: {e}"))?;
                d.total_in() as usize
            }
            1 => {
                let mut d = bzip2::bufread::BzDecoder::new(rest);
                d.read_to_end(&mut out)
                    .map_err(|e| format!("bzip2 region at byte {off}: {e}"))?;
                d.total_in() as usize
            }
            2 => {
                out.extend_from_slice(rest);
                rest.len()
            }
            c => return Err(format!("unknown compression {c}")),
        };
        if used == 0 {
            return Err(format!("region at byte {off} does not decompress"));
        }
        rest = &rest[used..];
    }
    Ok(out)
}

/// Reads a Darshan log's DXT_POSIX records into a trace.
pub fn parse(raw: &[u8]) -> Result<Trace, String> {
    let h = header(raw)?;
    let dxt = if h.version.starts_with("3.0") || h.version.starts_with("3.1") {
        8
    } else {
        9
    };
    let region = h.modules.get(dxt).copied().unwrap_or((0, 0));
    if region.1 == 0 {
        return Err(format!(
            "Darshan log {}: no DXT_POSIX records (DXT was off when it was recorded; set DXT_ENABLE_IO_TRACE=1): parcache replays per-operation records only",
            h.version
        ));
    }
    // Path names by record id.
    let names_raw = inflate(raw, h.names, h.comp)?;
    let mut path_of = std::collections::HashMap::new();
    let mut at = 0;
    while at + 8 < names_raw.len() {
        let id = u64_at(&names_raw, at)?;
        let end = names_raw[at + 8..]
            .iter()
            .position(|&b| b == 0)
            .ok_or("a name record without its end")?;
        path_of.insert(
            id,
            String::from_utf8_lossy(&names_raw[at + 8..at + 8 + end]).into_owned(),
        );
        at += 8 + end + 1;
    }
    let data = inflate(raw, region, h.comp)?;
    let mut trace = Trace {
        format: Some(super::Format::Darshan),
        ..Trace::default()
    };
    let (mut files, mut nodes) = (Names::default(), Names::default());
    let mut at = 0;
    let mut records = 0usize;
    while at < data.len() {
        if at + RECORD > data.len() {
            return Err(format!("DXT record {records} is cut short"));
        }
        let id = u64_at(&data, at)?;
        let rank = u64_at(&data, at + 8)?;
        let host = &data[at + 24..at + 88];
        let host = String::from_utf8_lossy(&host[..host.iter().position(|&b| b == 0).unwrap_or(64)]).into_owned();
        let writes = u64_at(&data, at + 88)? as usize;
        let reads = u64_at(&data, at + 96)? as usize;
        let segs = writes.checked_add(reads).ok_or("bad segment counts")?;
        let end = at + RECORD + segs.checked_mul(SEGMENT).ok_or("bad segment counts")?;
        if end > data.len() {
            return Err(format!(
                "DXT record {records} claims {segs} segments, more than the log holds"
            ));
        }
        let path = path_of.get(&id).cloned().unwrap_or_else(|| format!("record-{id:016x}"));
        let (file, node) = (files.id(&path), nodes.id(&host));
        for s in 0..segs {
            let p = at + RECORD + s * SEGMENT;
            let (start, stop) = (f64_at(&data, p + 16)?, f64_at(&data, p + 24)?);
            trace.ops.push(Op {
                time: start.max(0.0),
                duration: (stop - start).max(0.0),
                node,
                process: rank,
                file,
                kind: if s < writes { TraceOp::Write } else { TraceOp::Read },
                offset: u64_at(&data, p)?,
                length: u64_at(&data, p + 8)?,
            });
        }
        at = end;
        records += 1;
    }
    if let Some(&mpiio) = h.modules.get(dxt + 1).filter(|r| r.1 > 0) {
        let segments = count_segments(&inflate(raw, mpiio, h.comp)?);
        trace.notes.push(format!(
            "{segments} DXT_MPIIO segments left out: MPI-IO reaches the file system as the POSIX segments replayed"
        ));
    }
    if h.partial & (1 << dxt) != 0 {
        trace
            .notes
            .push("Darshan marked DXT partial: it ran out of trace memory, so later operations are missing".into());
    }
    trace.files = files.list;
    trace.nodes = nodes.list;
    Ok(trace)
}

/// Segments in a DXT region (its records are as DXT_POSIX's).
fn count_segments(data: &[u8]) -> u64 {
    let (mut at, mut n) = (0, 0);
    while let (Ok(w), Ok(r)) = (u64_at(data, at + 88), u64_at(data, at + 96)) {
        n += w + r;
        at += RECORD + (w + r) as usize * SEGMENT;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_that_is_not_whole_is_refused() {
        let mut raw = b"3.21\0\0\0\0".to_vec();
        raw.extend_from_slice(&MAGIC.to_le_bytes());
        assert!(is_darshan(&raw));
        raw.resize(400, 0);
        raw[24..32].copy_from_slice(&10_000u64.to_le_bytes());
        raw[32..40].copy_from_slice(&5u64.to_le_bytes());
        let e = parse(&raw).unwrap_err();
        assert!(e.contains("do not fit"), "{e}");
        let mut swapped = b"3.21\0\0\0\0".to_vec();
        swapped.extend_from_slice(&MAGIC.to_be_bytes());
        swapped.resize(400, 0);
        assert!(parse(&swapped).unwrap_err().contains("big-endian"));
    }
}
