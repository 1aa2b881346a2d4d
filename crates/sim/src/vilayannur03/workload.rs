//! Out-of-core array sweeps like the paper's I/O-intensive tomcatv (§4):
//! arrays of `n × n` doubles, one file each, read and written from files in
//! loop nests, and a poor-locality kernel (random blocks of two arrays,
//! like the paper's DB2 and data-mining traces of Fig. 5).
//!
//! The tomcatv-like kernel's nests, per iteration (the arrays are tomcatv's
//! X, Y, RX, RY, AA, DD, D):
//! 1. read X, Y; write RX, RY;
//! 2. read RX, RY, AA, DD; write D;
//! 3. read D; read and write X, Y.
//!
//! RX, RY and D are reused by the next nest (short-term locality), X and Y
//! by the next iteration, AA and DD only once per iteration.

use crate::rng::SimRng;
use serde::Serialize;

/// The paper's block: 4 KiB (§3.3: 2 MB local cache = 500 blocks).
pub const BLOCK: u64 = 4096;

/// How a nest walks an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Order {
    /// Row by row: one request per row.
    Row,
    /// Column strips one block wide: one request per row per strip.
    Column,
    /// Tiles of 64 rows by one block.
    Tiled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Kernel {
    Tomcatv(Order),
    /// Random one-block requests over two of the arrays (X and Y), as many
    /// as the row-order tomcatv makes, in the same nests.
    Random,
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kernel::Tomcatv(Order::Row) => f.write_str("tomcatv-row"),
            Kernel::Tomcatv(Order::Column) => f.write_str("tomcatv-column"),
            Kernel::Tomcatv(Order::Tiled) => f.write_str("tomcatv-tiled"),
            Kernel::Random => f.write_str("random"),
        }
    }
}

/// One request of the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub file: u64,
    pub offset: u64,
    pub len: u64,
    pub write: bool,
}

/// The program: its requests, where each nest starts, its arrays' sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub requests: Vec<Request>,
    /// Index of each nest's first request, in order.
    pub nests: Vec<usize>,
    /// Bytes of each array (file `i` is array `i`).
    pub array_bytes: u64,
    pub arrays: u64,
}

const ARRAYS: u64 = 7;
const X: u64 = 0;
const Y: u64 = 1;
const RX: u64 = 2;
const RY: u64 = 3;
const AA: u64 = 4;
const DD: u64 = 5;
const D: u64 = 6;
/// The nests: (arrays read, arrays written) — read-and-written arrays are in both.
const NESTS: [(&[u64], &[u64]); 3] = [(&[X, Y], &[RX, RY]), (&[RX, RY, AA, DD], &[D]), (&[D, X, Y], &[X, Y])];

/// The pieces of one array an order visits, in order: (offset, len).
fn walk(order: Order, n: u64) -> Vec<(u64, u64)> {
    let row = n * 8;
    let strips = row.div_ceil(BLOCK);
    let piece = |i: u64, s: u64| (i * row + s * BLOCK, BLOCK.min(row - s * BLOCK));
    match order {
        Order::Row => (0..n).map(|i| (i * row, row)).collect(),
        Order::Column => (0..strips).flat_map(|s| (0..n).map(move |i| piece(i, s))).collect(),
        Order::Tiled => (0..n)
            .step_by(64)
            .flat_map(|r0| (0..strips).flat_map(move |s| (r0..(r0 + 64).min(n)).map(move |i| piece(i, s))))
            .collect(),
    }
}

/// `iterations` of the kernel on `n × n` arrays.
pub fn generate(kernel: Kernel, n: u64, iterations: usize, seed: u64) -> Workload {
    let array_bytes = n * n * 8;
    let mut requests = Vec::new();
    let mut nests = Vec::new();
    let mut rng = SimRng::new(seed);
    let order = match kernel {
        Kernel::Tomcatv(o) => o,
        Kernel::Random => Order::Row,
    };
    let pieces = walk(order, n);
    let blocks = array_bytes.div_ceil(BLOCK);
    for _ in 0..iterations {
        for (reads, writes) in NESTS {
            nests.push(requests.len());
            // The nest's arrays advance together, piece by piece.
            for &(off, len) in &pieces {
                for &a in reads {
                    requests.push(match kernel {
                        Kernel::Random => {
                            let b = rng.below(blocks);
                            Request {
                                file: rng.below(2),
                                offset: b * BLOCK,
                                len: BLOCK.min(array_bytes - b * BLOCK),
                                write: false,
                            }
                        }
                        Kernel::Tomcatv(_) => Request {
                            file: a,
                            offset: off,
                            len,
                            write: false,
                        },
                    });
                }
                for &a in writes {
                    requests.push(Request {
                        file: a,
                        offset: off,
                        len,
                        write: true,
                    });
                }
            }
        }
    }
    Workload {
        requests,
        nests,
        array_bytes,
        arrays: ARRAYS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_order_covers_each_array_byte_once_per_nest() {
        for order in [Order::Row, Order::Column, Order::Tiled] {
            let n = 700;
            let mut covered: Vec<(u64, u64)> = walk(order, n);
            covered.sort();
            let mut at = 0;
            for (off, len) in covered {
                assert_eq!(off, at, "{order:?}");
                at += len;
            }
            assert_eq!(at, n * n * 8, "{order:?}");
        }
        let w = generate(Kernel::Tomcatv(Order::Row), 100, 2, 1);
        assert_eq!(w.nests.len(), 6);
        // Per iteration: nest 1 has 4 arrays, nest 2 five, nest 3 five.
        assert_eq!(w.requests.len(), 2 * 100 * (4 + 5 + 5));
        let r = generate(Kernel::Random, 100, 2, 1);
        assert_eq!(r.requests.len(), w.requests.len());
        assert_eq!(r, generate(Kernel::Random, 100, 2, 1), "same seed, same program");
    }
}
