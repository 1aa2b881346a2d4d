//! Every trace in `../shared/traces` (real traces recorded by others,
//! beside the repository) reads, with the counts its README states.

use parcache_core::TraceOp;
use parcache_sim::trace::{load, Format};
use std::path::PathBuf;

fn traces() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    assert!(
        p.is_dir(),
        "{} is missing: the shared traces sit beside the repository",
        p.display()
    );
    p
}

fn darshan(prefix: &str) -> PathBuf {
    let dir = traces().join("darshan");
    let name = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| n.starts_with(prefix) && n.ends_with(".darshan"))
        .unwrap_or_else(|| panic!("no {prefix}* in {}", dir.display()));
    dir.join(name)
}

#[test]
fn darshan_dxt_logs_read_with_their_ranks_and_segments() {
    // The README's counts (~277k, ~91k, ~26k) are POSIX and MPI-IO
    // segments together; the POSIX ones are what reached the file system
    // (under collective I/O only the aggregators' ranks: 64 of 384).
    for (prefix, ranks, segments, mpiio) in [
        ("dxt-explorer__jeanbez_8_benchmark", 1024, 123_166, 153_716),
        ("dxt-explorer__jlbez_IO_test5", 192, 77_696, 13_184),
        ("drishti__jlbez_8a_benchmark", 64, 17_525, 8_448),
    ] {
        let t = load(&darshan(prefix)).unwrap();
        assert_eq!(t.format, Some(Format::Darshan));
        let io = t
            .ops
            .iter()
            .filter(|o| matches!(o.kind, TraceOp::Read | TraceOp::Write))
            .count();
        assert_eq!(io, segments, "{prefix}");
        assert!(
            t.notes.iter().any(|n| n.starts_with(&format!("{mpiio} DXT_MPIIO"))),
            "{prefix}: {:?}",
            t.notes
        );
        let s = t.summary();
        assert_eq!(s.processes, ranks, "{prefix}");
        assert!(s.nodes > 1 && s.nodes <= ranks, "{prefix}: {} hosts", s.nodes);
        assert!(t.files.iter().any(|f| f.starts_with('/')), "{prefix}: paths resolved");
        // One session per rank and file: as many opens as closes.
        let opens = t.ops.iter().filter(|o| o.kind == TraceOp::Open).count();
        assert_eq!(opens, t.ops.iter().filter(|o| o.kind == TraceOp::Close).count());
        assert!(t.ops.windows(2).all(|w| w[0].time <= w[1].time));
    }
}

#[test]
fn block_traces_read_with_their_counts() {
    let t = load(&traces().join("block/sprite.trace.gz")).unwrap();
    assert_eq!(t.format, Some(Format::BlockIds));
    assert_eq!(t.summary().reads, 133_996);
    let t = load(&traces().join("block/msr-cambridge1-sample.csv")).unwrap();
    assert_eq!(t.format, Some(Format::MsrCambridge));
    let s = t.summary();
    assert_eq!(s.reads + s.writes, 1_000);
    let t = load(&traces().join("block/cloud_storage-sample.bz2")).unwrap();
    assert_eq!(t.format, Some(Format::TencentCloud));
    let s = t.summary();
    assert_eq!(s.reads + s.writes, 50_000);
}
