//! One file operation as parcache records and replays it (the trace format
//! of `parcache mount --record` and `parcache sim replay`, docs/advisor.md):
//! when it started, on which node and process, on which file, what it did
//! to which bytes, and how long it took. The same record is written by the
//! mount (one JSON object per line) and read by the simulator (JSONL or
//! CSV with these column names), so a recorded run replays under other
//! policies.

use serde::{Deserialize, Serialize};

/// What an operation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceOp {
    Open,
    Read,
    Write,
    Fsync,
    Close,
}

impl TraceOp {
    pub const ALL: [TraceOp; 5] = [
        TraceOp::Open,
        TraceOp::Read,
        TraceOp::Write,
        TraceOp::Fsync,
        TraceOp::Close,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TraceOp::Open => "open",
            TraceOp::Read => "read",
            TraceOp::Write => "write",
            TraceOp::Fsync => "fsync",
            TraceOp::Close => "close",
        }
    }
}

impl std::str::FromStr for TraceOp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let l = s.trim().to_ascii_lowercase();
        TraceOp::ALL.into_iter().find(|o| o.name() == l).ok_or_else(|| {
            format!(
                "unknown operation '{s}' (known: {})",
                TraceOp::ALL.map(TraceOp::name).join(", ")
            )
        })
    }
}

/// One operation, as a line of a trace.
///
/// `time` and `duration` are seconds (from the recording's start);
/// `offset` and `length` are bytes (0 for open, close and fsync). `node`
/// names the machine (a host name or number), `process` a process on it.
/// For an open, `length` is 1 if the file was opened for writing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceRecord {
    pub time: f64,
    #[serde(deserialize_with = "string_or_number")]
    pub node: String,
    pub process: u64,
    pub file: String,
    pub op: TraceOp,
    #[serde(default)]
    pub offset: u64,
    #[serde(default)]
    pub length: u64,
    /// How long the operation took; 0 if not known.
    #[serde(default)]
    pub duration: f64,
}

/// The CSV header of the format, in column order.
pub const CSV_HEADER: &str = "time,node,process,file,op,offset,length,duration";

fn string_or_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        S(String),
        U(u64),
        I(i64),
    }
    Ok(match Either::deserialize(d)? {
        Either::S(s) => s,
        Either::U(n) => n.to_string(),
        Either::I(n) => n.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_names_round_trip_and_bad_ones_are_named() {
        for o in TraceOp::ALL {
            assert_eq!(o.name().parse::<TraceOp>().unwrap(), o);
        }
        assert_eq!("WRITE".parse::<TraceOp>().unwrap(), TraceOp::Write);
        let e = "seek".parse::<TraceOp>().unwrap_err();
        assert!(e.contains("seek") && e.contains("fsync"), "{e}");
    }
}
