//! The Sprite-derived block trace (`crates/sim/traces/sprite.trace.gz`,
//! from the LIRS trace set): 133,996 references to 7,075 blocks, merged
//! over every client, with no times, clients or offsets. The paper's
//! workload was the Sprite traces themselves (48 clients, two days, §7.1).

use std::io::Read;
use std::sync::OnceLock;

static SPRITE_GZ: &[u8] = include_bytes!("../../traces/sprite.trace.gz");

/// The trace's block ids, in order (decoded once per process).
pub fn sprite() -> &'static [u32] {
    static REFS: OnceLock<Vec<u32>> = OnceLock::new();
    REFS.get_or_init(|| {
        let mut text = String::new();
        flate2::read::GzDecoder::new(SPRITE_GZ)
            .read_to_string(&mut text)
            .expect("the vendored Sprite trace decompresses");
        text.lines().filter_map(|l| l.trim().parse().ok()).collect()
    })
}

/// Deals a merged reference stream out to `clients`: each run of `run`
/// consecutive references goes to one client, the clients in turn. The
/// trace names no clients; a run stands for one client's burst of a
/// session (consecutive references of one file). Each reference keeps its
/// position in the merged stream (to measure from a warm-up point).
pub fn by_client(refs: &[u32], clients: usize, run: usize) -> Vec<Vec<(usize, u32)>> {
    let mut out = vec![Vec::new(); clients];
    for (i, &b) in refs.iter().enumerate() {
        out[(i / run.max(1)) % clients].push((i, b));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_is_whole() {
        let refs = sprite();
        assert_eq!(refs.len(), 133_996);
        let distinct: std::collections::HashSet<u32> = refs.iter().copied().collect();
        assert_eq!(distinct.len(), 7_075);
        let dealt = by_client(refs, 48, 64);
        assert_eq!(dealt.iter().map(Vec::len).sum::<usize>(), refs.len());
        assert_eq!(dealt[1][0], (64, refs[64]));
    }
}
