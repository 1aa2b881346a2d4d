//! parcache's own trace format ([`parcache_core::TraceRecord`]): CSV with
//! the header `time,node,process,file,op,offset,length,duration`
//! (`duration` may be left out) or one JSON object per line with the same
//! keys. `parcache mount --record` writes the JSONL form.

use super::{Names, Op, Trace};
use parcache_core::TraceRecord;

/// A line number (from 1) and what is wrong there.
pub type LineError = (usize, String);

fn push(
    trace: &mut Trace,
    files: &mut Names,
    nodes: &mut Names,
    r: &TraceRecord,
    line: usize,
) -> Result<(), LineError> {
    if !(r.time.is_finite() && r.time >= 0.0 && r.duration.is_finite() && r.duration >= 0.0) {
        return Err((
            line,
            format!("time {} and duration {} must be seconds ≥ 0", r.time, r.duration),
        ));
    }
    if r.file.is_empty() {
        return Err((line, "the file is empty".into()));
    }
    if r.offset.checked_add(r.length).is_none() {
        return Err((line, format!("offset {} + length {} overflows", r.offset, r.length)));
    }
    trace.ops.push(Op {
        time: r.time,
        duration: r.duration,
        node: nodes.id(&r.node),
        process: r.process,
        file: files.id(&r.file),
        kind: r.op,
        offset: r.offset,
        length: r.length,
    });
    Ok(())
}

fn build(
    records: impl Iterator<Item = Result<(usize, TraceRecord), LineError>>,
    format: super::Format,
) -> Result<Trace, LineError> {
    let mut trace = Trace {
        format: Some(format),
        ..Trace::default()
    };
    let (mut files, mut nodes) = (Names::default(), Names::default());
    for r in records {
        let (line, r) = r?;
        push(&mut trace, &mut files, &mut nodes, &r, line)?;
    }
    trace.files = files.list;
    trace.nodes = nodes.list;
    Ok(trace)
}

/// Reads the CSV form.
pub fn parse_csv(text: &str) -> Result<Trace, LineError> {
    let mut rd = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let headers = rd.headers().map_err(|e| (1, e.to_string()))?.clone();
    for need in ["time", "node", "process", "file", "op"] {
        if !headers.iter().any(|h| h == need) {
            return Err((
                1,
                format!(
                    "the header has no '{need}' column (expected '{}')",
                    parcache_core::trace::CSV_HEADER
                ),
            ));
        }
    }
    let records = rd.into_deserialize::<TraceRecord>().enumerate().map(|(i, r)| {
        r.map(|r| (i + 2, r)).map_err(|e| {
            let line = e.position().map_or(i + 2, |p| p.line() as usize);
            (line, csv_detail(&e))
        })
    });
    build(records, super::Format::Csv)
}

fn csv_detail(e: &csv::Error) -> String {
    match e.kind() {
        csv::ErrorKind::Deserialize { err, .. } => match err.field() {
            Some(f) => format!("field {}: {}", f + 1, err.kind()),
            None => err.to_string(),
        },
        _ => e.to_string(),
    }
}

/// Reads the JSONL form (blank lines are skipped).
pub fn parse_jsonl(text: &str) -> Result<Trace, LineError> {
    // A recording cut short (a full disk, a copy stopped half way) ends in
    // a partial line without its newline: that line is left out, said so;
    // a bad line anywhere else is an error.
    let cut = !text.ends_with('\n')
        && text
            .lines()
            .last()
            .is_some_and(|l| serde_json::from_str::<TraceRecord>(l).is_err());
    let lines: Vec<&str> = text.lines().collect();
    let keep = if cut { lines.len() - 1 } else { lines.len() };
    let records = lines[..keep]
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str::<TraceRecord>(l)
                .map(|r| (i + 1, r))
                .map_err(|e| (i + 1, e.to_string()))
        });
    let mut t = build(records, super::Format::Jsonl)?;
    if cut {
        t.notes.push(format!(
            "the last line ({}) is cut short, as a recording stopped mid-write leaves it: left out",
            lines.len()
        ));
    }
    Ok(t)
}

/// The trace as parcache's CSV (for `sim replay --export`).
pub fn to_csv(trace: &Trace) -> String {
    let mut w = csv::Writer::from_writer(Vec::new());
    for o in &trace.ops {
        w.serialize(record(trace, o)).expect("writing to memory");
    }
    String::from_utf8(w.into_inner().expect("writing to memory")).expect("CSV of UTF-8 fields")
}

/// One operation as a record.
pub fn record(trace: &Trace, o: &Op) -> TraceRecord {
    TraceRecord {
        time: o.time,
        node: trace.nodes[o.node as usize].clone(),
        process: o.process,
        file: trace.files[o.file as usize].clone(),
        op: o.kind,
        offset: o.offset,
        length: o.length,
        duration: o.duration,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcache_core::TraceOp;

    #[test]
    fn csv_and_jsonl_read_the_same_records() {
        let csv = "time,node,process,file,op,offset,length,duration\n\
                   0.0,n1,7,/data/a,open,0,1,0\n\
                   0.5,n1,7,/data/a,write,0,4096,0.001\n\
                   1.0,n1,7,/data/a,close,0,0,0\n";
        let jsonl = r#"{"time":0.0,"node":"n1","process":7,"file":"/data/a","op":"open","length":1}
{"time":0.5,"node":"n1","process":7,"file":"/data/a","op":"write","offset":0,"length":4096,"duration":0.001}

{"time":1.0,"node":"n1","process":7,"file":"/data/a","op":"close"}"#;
        let a = parse_csv(csv).unwrap();
        let b = parse_jsonl(jsonl).unwrap();
        assert_eq!(a.ops, b.ops);
        assert_eq!(a.ops[1].kind, TraceOp::Write);
        assert_eq!(a.ops[1].length, 4096);
        assert_eq!(a.files, ["/data/a"]);
        // Back out and in again.
        let again = parse_csv(&to_csv(&a)).unwrap();
        assert_eq!(again.ops, a.ops);
    }

    #[test]
    fn a_number_names_a_node_too_and_duration_may_be_left_out() {
        let t =
            parse_jsonl(r#"{"time":1,"node":3,"process":1,"file":"f","op":"read","offset":0,"length":10}"#).unwrap();
        assert_eq!(t.nodes, ["3"]);
        let t = parse_csv("time,node,process,file,op,offset,length\n0,a,1,f,read,0,10\n").unwrap();
        assert_eq!(t.ops[0].duration, 0.0);
    }

    #[test]
    fn bad_lines_are_named() {
        let e =
            parse_csv("time,node,process,file,op,offset,length\n0,a,1,f,read,0,10\n0,a,1,f,seek,0,10\n").unwrap_err();
        assert_eq!(e.0, 3, "{e:?}");
        let e = parse_jsonl("{\"time\":0,\"node\":\"a\",\"process\":1,\"file\":\"f\",\"op\":\"read\"}\n{\"time\":-1,\"node\":\"a\",\"process\":1,\"file\":\"f\",\"op\":\"read\"}").unwrap_err();
        assert_eq!(e.0, 2);
        assert!(e.1.contains("≥ 0"), "{e:?}");
        let e = parse_csv("time,node,file,op\n").unwrap_err();
        assert!(e.1.contains("'process'"), "{e:?}");
        let e = parse_jsonl("{\"time\":0,\"node\":\"a\",\"process\":1,\"file\":\"f\",\"op\":\"read\",\"offset\":18446744073709551615,\"length\":2}").unwrap_err();
        assert!(e.1.contains("overflows"), "{e:?}");
    }

    #[test]
    fn a_recording_cut_mid_line_loses_only_that_line() {
        let one = "{\"time\":0,\"node\":\"a\",\"process\":1,\"file\":\"f\",\"op\":\"read\",\"length\":10}\n";
        let t = parse_jsonl(&format!("{one}{one}{{\"time\":1,\"no")).unwrap();
        assert_eq!(t.ops.len(), 2);
        assert!(
            t.notes.iter().any(|n| n.contains("line (3) is cut short")),
            "{:?}",
            t.notes
        );
        // A bad line that ends in its newline is still an error, named.
        let e = parse_jsonl(&format!("{one}{{\"time\":1,\"no\n{one}")).unwrap_err();
        assert_eq!(e.0, 2);
    }
}
