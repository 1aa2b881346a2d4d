//! Block-level traces: requests to a disk or volume, with no files and no
//! opens. Each disk or volume becomes one file, read and written by one
//! process per volume; a trace without times (the LIRS block-id lists)
//! runs its references back to back.

use super::records::LineError;
use super::{Format, Names, Op, Trace};
use parcache_core::TraceOp;

/// The block size of the LIRS traces (the Sprite-derived one counts 8 KiB
/// blocks, as the 1996 PACA model does).
pub const LIRS_BLOCK: u64 = 8 << 10;
const SECTOR: u64 = 512;

fn field<'a>(fields: &[&'a str], i: usize, line: usize, what: &str) -> Result<&'a str, LineError> {
    fields
        .get(i)
        .copied()
        .ok_or_else(|| (line, format!("no {what} (field {})", i + 1)))
}

fn number(s: &str, line: usize, what: &str) -> Result<u64, LineError> {
    s.trim()
        .parse()
        .map_err(|_| (line, format!("{what} '{s}' is not a whole number")))
}

/// One decimal block id per line: reads of `LIRS_BLOCK` bytes, no times.
pub fn block_ids(text: &str) -> Result<Trace, LineError> {
    let mut trace = Trace {
        format: Some(Format::BlockIds),
        files: vec!["blocks".into()],
        nodes: vec!["node0".into()],
        ..Trace::default()
    };
    for (i, l) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let b = number(l, i + 1, "block id")?;
        trace.ops.push(Op {
            time: 0.0,
            duration: 0.0,
            node: 0,
            process: 0,
            file: 0,
            kind: TraceOp::Read,
            offset: b * LIRS_BLOCK,
            length: LIRS_BLOCK,
        });
    }
    trace
        .notes
        .push("block ids only: every reference is an 8 KiB read by one process, back to back (no times, clients or writes recorded)".into());
    Ok(trace)
}

/// MSR Cambridge: `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`,
/// times in Windows FILETIME units (100 ns).
pub fn msr(text: &str) -> Result<Trace, LineError> {
    let mut trace = Trace {
        format: Some(Format::MsrCambridge),
        ..Trace::default()
    };
    let (mut files, mut nodes) = (Names::default(), Names::default());
    for (i, l) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let line = i + 1;
        let f: Vec<&str> = l.split(',').map(str::trim).collect();
        let t = number(field(&f, 0, line, "timestamp")?, line, "timestamp")?;
        let host = field(&f, 1, line, "host name")?;
        let disk = field(&f, 2, line, "disk")?;
        let kind = match field(&f, 3, line, "type")? {
            "Read" => TraceOp::Read,
            "Write" => TraceOp::Write,
            other => return Err((line, format!("type '{other}' is neither Read nor Write"))),
        };
        let disk_no = number(disk, line, "disk")?;
        trace.ops.push(Op {
            time: t as f64 * 1e-7,
            duration: number(field(&f, 6, line, "response time")?, line, "response time")? as f64 * 1e-7,
            node: nodes.id(host),
            process: disk_no,
            file: files.id(&format!("{host}_{disk}")),
            kind,
            offset: number(field(&f, 4, line, "offset")?, line, "offset")?,
            length: number(field(&f, 5, line, "size")?, line, "size")?,
        });
    }
    trace.files = files.list;
    trace.nodes = nodes.list;
    Ok(trace)
}

/// Tencent cloud block storage: `time,offset,size,type,volume`, times in
/// whole seconds, offsets and sizes in 512-byte sectors, type 0 read and 1
/// write. Each volume is a virtual machine's disk: its own node, with one
/// process.
pub fn tencent(text: &str) -> Result<Trace, LineError> {
    let mut trace = Trace {
        format: Some(Format::TencentCloud),
        ..Trace::default()
    };
    let (mut files, mut nodes) = (Names::default(), Names::default());
    for (i, l) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let line = i + 1;
        let f: Vec<&str> = l.split(',').map(str::trim).collect();
        let kind = match field(&f, 3, line, "type")? {
            "0" => TraceOp::Read,
            "1" => TraceOp::Write,
            other => return Err((line, format!("type '{other}' is neither 0 (read) nor 1 (write)"))),
        };
        let volume = number(field(&f, 4, line, "volume")?, line, "volume")?;
        let sectors = |i, what| -> Result<u64, LineError> {
            number(field(&f, i, line, what)?, line, what)?
                .checked_mul(SECTOR)
                .ok_or((line, format!("{what} overflows")))
        };
        trace.ops.push(Op {
            time: number(field(&f, 0, line, "time")?, line, "time")? as f64,
            duration: 0.0,
            node: nodes.id(&format!("vm-{volume}")),
            process: 0,
            file: files.id(&format!("volume-{volume}")),
            kind,
            offset: sectors(1, "offset")?,
            length: sectors(2, "size")?,
        });
    }
    trace.files = files.list;
    trace.nodes = nodes.list;
    trace
        .notes
        .push("times are whole seconds: requests of one second start together, in file order".into());
    Ok(trace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_block_format_reads_its_lines() {
        let t = block_ids("5\n7\n\n5\n").unwrap();
        assert_eq!(t.ops.len(), 3);
        assert_eq!(t.ops[1].offset, 7 * LIRS_BLOCK);
        let t = msr("128166385295514663,hm,0,Write,9056014336,2048,2833\n128166385295515175,hm,1,Read,0,4096,2320\n")
            .unwrap();
        assert_eq!(t.files, ["hm_0", "hm_1"]);
        assert_eq!(t.ops[0].kind, TraceOp::Write);
        assert!((t.ops[0].duration - 2833e-7).abs() < 1e-12);
        let t = tencent("1538323200,4247200,128,1,1058\n1538323199,13896880,128,0,1063\n").unwrap();
        assert_eq!(t.ops[0].offset, 4247200 * 512);
        assert_eq!(t.ops[0].length, 128 * 512);
        assert_eq!(t.ops[1].kind, TraceOp::Read);
        assert_eq!(t.files, ["volume-1058", "volume-1063"]);
    }

    #[test]
    fn bad_lines_are_named() {
        assert_eq!(block_ids("5\nseven\n").unwrap_err().0, 2);
        let e = msr("1,hm,0,Erase,0,1,1\n").unwrap_err();
        assert!(e.1.contains("Erase"), "{e:?}");
        let e = tencent("1,2,3,1\n").unwrap_err();
        assert!(e.1.contains("volume"), "{e:?}");
    }
}
