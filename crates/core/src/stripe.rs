//! Stripe arithmetic: where a file's bytes live among its servers or disks.
//! Files are interleaved round-robin in units of `unit` bytes (1992 §3.1:
//! "blocks of the file allocated round-robin to all disks"; PVFS's striping
//! in the 2003 and 2005 papers).

use serde::{Deserialize, Serialize};

/// How a file is laid out over `width` servers (or disks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeLayout {
    /// Bytes per stripe unit.
    pub unit: u64,
    /// Number of servers the file is spread over.
    pub width: u32,
    /// Server that holds unit 0 (layouts rotate the start to spread load).
    pub first: u32,
}

/// A run of bytes that lives contiguously on one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripeChunk {
    /// Position of the server in the layout's server list.
    pub server: u32,
    /// Offset of the chunk inside that server's part of the file.
    pub server_offset: u64,
    /// Offset of the chunk in the file.
    pub file_offset: u64,
    pub len: u64,
}

impl StripeLayout {
    pub fn new(unit: u64, width: u32) -> Self {
        assert!(unit > 0 && width > 0, "stripe unit and width must be positive");
        StripeLayout { unit, width, first: 0 }
    }

    /// Server holding the stripe unit that contains file byte `offset`.
    pub fn server_of(&self, offset: u64) -> u32 {
        (((offset / self.unit) + self.first as u64) % self.width as u64) as u32
    }

    /// Server holding the `index`-th unit (block) of the file.
    pub fn server_of_unit(&self, index: u64) -> u32 {
        ((index + self.first as u64) % self.width as u64) as u32
    }

    /// Splits file bytes `[offset, offset+len)` into per-server chunks in file order.
    pub fn chunks(&self, offset: u64, len: u64) -> impl Iterator<Item = StripeChunk> + '_ {
        let end = offset + len;
        let mut pos = offset;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let unit_index = pos / self.unit;
            let within = pos % self.unit;
            let n = (self.unit - within).min(end - pos);
            let chunk = StripeChunk {
                server: self.server_of_unit(unit_index),
                server_offset: (unit_index / self.width as u64) * self.unit + within,
                file_offset: pos,
                len: n,
            };
            pos += n;
            Some(chunk)
        })
    }

    /// Number of bytes of a file of `size` bytes that server position `server` holds.
    pub fn server_bytes(&self, size: u64, server: u32) -> u64 {
        let full_units = size / self.unit;
        let tail = size % self.unit;
        let rel = (server + self.width - self.first % self.width) % self.width;
        let mut units = full_units / self.width as u64;
        if (full_units % self.width as u64) > rel as u64 {
            units += 1;
        }
        let mut bytes = units * self.unit;
        if tail > 0 && (full_units % self.width as u64) == rel as u64 {
            bytes += tail;
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn blocks_round_robin_over_disks() {
        let l = StripeLayout::new(1024, 20);
        assert_eq!(l.server_of_unit(0), 0);
        assert_eq!(l.server_of_unit(19), 19);
        assert_eq!(l.server_of_unit(20), 0);
        assert_eq!(l.server_of(20 * 1024 + 5), 0);
    }

    proptest! {
        #[test]
        fn chunks_partition_the_range(unit in 1u64..5000, width in 1u32..9, first in 0u32..9,
                                      offset in 0u64..200_000, len in 0u64..100_000) {
            let l = StripeLayout { unit, width, first: first % width };
            let mut pos = offset;
            let mut per_server = vec![0u64; width as usize];
            for c in l.chunks(offset, len) {
                prop_assert_eq!(c.file_offset, pos);
                prop_assert_eq!(c.server, l.server_of(pos));
                prop_assert!(c.len > 0);
                pos += c.len;
                per_server[c.server as usize] += c.len;
            }
            prop_assert_eq!(pos, offset + len);
            if offset == 0 {
                for s in 0..width {
                    prop_assert_eq!(l.server_bytes(len, s), per_server[s as usize]);
                }
            }
        }
    }
}
