//! The parts of FUSE's wire format a queue entry carries (Linux's
//! `include/uapi/linux/fuse.h`, protocol 7.42): the request header the
//! kernel writes, the reply header it reads, and the entry's own fields.
//! Pure functions over byte slices, so they can be tested without a kernel.

/// `struct fuse_in_header`: len, opcode, unique, nodeid, uid, gid, pid,
/// total_extlen, padding.
pub const IN_HEADER: usize = 40;
/// `struct fuse_out_header`: len, error, unique.
pub const OUT_HEADER: usize = 16;

/// Where an entry's header buffer (`struct fuse_uring_req_header`) keeps
/// each part: the request's or reply's FUSE header (`in_out`, 128 bytes),
/// the opcode's own header (`op_in`, 128 bytes), then
/// `struct fuse_uring_ent_in_out` (flags, commit_id, payload_sz, padding,
/// reserved).
pub const IN_OUT_AT: usize = 0;
pub const OP_IN_AT: usize = 128;
pub const OP_IN_MAX: usize = 128;
pub const ENT_IN_OUT_AT: usize = 256;
/// Bytes of `struct fuse_uring_req_header`; the kernel refuses a smaller
/// header buffer.
pub const REQ_HEADER: usize = 256 + 32;

/// The `INIT` flag (in `flags2`, bit 41 of the 64-bit flags) by which the
/// kernel offers, and the server accepts, requests over io_uring.
pub const FUSE_OVER_IO_URING: u64 = 1 << 41;

/// The io_uring commands of FUSE (`enum fuse_uring_cmd`).
pub const CMD_REGISTER: u32 = 1;
pub const CMD_COMMIT_AND_FETCH: u32 = 2;

/// One request as a queue entry holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The request's whole length as /dev/fuse would give it (FUSE header,
    /// opcode header and payload).
    pub len: u32,
    pub opcode: u32,
    /// The request's id, which its reply names.
    pub unique: u64,
    /// The inode the request is about.
    pub node: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// The id the reply's commit must carry (`ent_in_out.commit_id`).
    pub commit: u64,
    /// Bytes of the payload buffer the request filled.
    pub payload: u32,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Header {
    /// Reads a request from an entry's header buffer (at least
    /// [`REQ_HEADER`] bytes).
    pub fn read(h: &[u8]) -> Header {
        let f = &h[IN_OUT_AT..];
        let e = &h[ENT_IN_OUT_AT..];
        Header {
            len: u32_at(f, 0),
            opcode: u32_at(f, 4),
            unique: u64_at(f, 8),
            node: u64_at(f, 16),
            uid: u32_at(f, 24),
            gid: u32_at(f, 28),
            pid: u32_at(f, 32),
            commit: u64_at(e, 8),
            payload: u32_at(e, 16),
        }
    }

    /// Bytes of the opcode's own header in `op_in`: what the request's
    /// length leaves beside the FUSE header and the payload (none for
    /// opcodes that have no header of their own, such as `LOOKUP`).
    pub fn op_len(&self) -> Option<usize> {
        let rest = (self.len as usize).checked_sub(IN_HEADER + self.payload as usize)?;
        (rest <= OP_IN_MAX).then_some(rest)
    }
}

/// Bytes of opcode `opcode`'s own header (`in_args[0]`, `fuse_*_in`), as
/// /dev/fuse lays it out between the FUSE header and the payload (a queue
/// entry keeps it apart, in `op_in`), at protocol 7.36 as fuser
/// negotiates it; None for an opcode this table does not know (the mount
/// serves none of those).
pub fn device_op_len(opcode: u32) -> Option<usize> {
    Some(match opcode {
        // LOOKUP, READLINK, SYMLINK, UNLINK, RMDIR, STATFS, REMOVEXATTR:
        // names or nothing.
        1 | 5 | 6 | 10 | 11 | 17 | 24 => 0,
        // FORGET (nlookup), RENAME (newdir), LINK (oldnodeid), OPEN and
        // OPENDIR (flags, open_flags), MKDIR (mode, umask), SETXATTR
        // (size, flags), GETXATTR and LISTXATTR (size, padding),
        // BATCH_FORGET (count, dummy), INTERRUPT (unique).
        2 | 12 | 13 | 14 | 27 | 9 | 21 | 22 | 23 | 42 | 36 => 8,
        // GETATTR (flags, dummy, fh), MKNOD (mode, rdev, umask, padding),
        // FSYNC and FSYNCDIR (fh, flags, padding), CREATE (flags, mode,
        // umask, open_flags), RENAME2 (newdir, flags, padding).
        3 | 8 | 20 | 30 | 35 | 45 => 16,
        // RELEASE, RELEASEDIR, FLUSH (fh, two u32, lock_owner), LSEEK.
        18 | 29 | 25 | 46 => 24,
        // IOCTL, FALLOCATE.
        39 | 43 => 32,
        // READ, WRITE, READDIR (fh, offset, size, flags, lock_owner,
        // flags, padding).
        15 | 16 | 28 => 40,
        // COPY_FILE_RANGE.
        47 => 56,
        // SETATTR.
        4 => 88,
        // DESTROY.
        38 => 0,
        _ => return None,
    })
}

impl Header {
    /// Reads a request as /dev/fuse gives it (`b` all of it): the FUSE
    /// header at its front, then the opcode's header
    /// ([`device_op_len`]), then the payload. None if `b` is shorter than
    /// the FUSE header, than the length it states, or than the opcode's
    /// header.
    pub fn read_device(b: &[u8]) -> Option<Header> {
        if b.len() < IN_HEADER {
            return None;
        }
        let len = u32_at(b, 0);
        let opcode = u32_at(b, 4);
        let op = device_op_len(opcode).unwrap_or(0);
        let payload = (len as usize).checked_sub(IN_HEADER + op)?;
        if (len as usize) > b.len() {
            return None;
        }
        Some(Header {
            len,
            opcode,
            unique: u64_at(b, 8),
            node: u64_at(b, 16),
            uid: u32_at(b, 24),
            gid: u32_at(b, 28),
            pid: u32_at(b, 32),
            commit: 0,
            payload: payload as u32,
        })
    }
}

/// Writes a reply into an entry's header buffer: the FUSE reply header
/// (`error` a negative errno or 0) and the payload's length, `body` bytes
/// already in the payload buffer.
pub fn write_reply(h: &mut [u8], unique: u64, error: i32, body: usize) {
    let f = &mut h[IN_OUT_AT..IN_OUT_AT + OUT_HEADER];
    f[0..4].copy_from_slice(&((OUT_HEADER + body) as u32).to_le_bytes());
    f[4..8].copy_from_slice(&error.to_le_bytes());
    f[8..16].copy_from_slice(&unique.to_le_bytes());
    h[ENT_IN_OUT_AT + 16..ENT_IN_OUT_AT + 20].copy_from_slice(&(body as u32).to_le_bytes());
}

/// The command data of a queue entry's SQE (`struct fuse_uring_cmd_req`:
/// flags, commit_id, qid), within the 80 bytes a 128-byte SQE carries.
pub fn command(qid: u16, commit: u64) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit.to_le_bytes());
    c[16..18].copy_from_slice(&qid.to_le_bytes());
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `READ` as the kernel lays it out in an entry: FUSE header in
    /// `in_out`, `fuse_read_in` (40 bytes) in `op_in`, nothing in the
    /// payload, the commit id in `ent_in_out`.
    #[test]
    fn a_read_request_is_read_from_its_places() {
        let mut h = vec![0u8; REQ_HEADER];
        h[0..4].copy_from_slice(&80u32.to_le_bytes());
        h[4..8].copy_from_slice(&15u32.to_le_bytes());
        h[8..16].copy_from_slice(&0x1234u64.to_le_bytes());
        h[16..24].copy_from_slice(&7u64.to_le_bytes());
        h[32..36].copy_from_slice(&99u32.to_le_bytes());
        h[ENT_IN_OUT_AT + 8..ENT_IN_OUT_AT + 16].copy_from_slice(&0x1234u64.to_le_bytes());
        let r = Header::read(&h);
        assert_eq!(
            (r.opcode, r.unique, r.node, r.pid, r.commit, r.payload),
            (15, 0x1234, 7, 99, 0x1234, 0)
        );
        assert_eq!(r.op_len(), Some(40));
    }

    /// A `LOOKUP` has no header of its own: its name is all payload.
    #[test]
    fn a_lookup_is_all_payload() {
        let mut h = vec![0u8; REQ_HEADER];
        h[0..4].copy_from_slice(&(40u32 + 5).to_le_bytes());
        h[ENT_IN_OUT_AT + 16..ENT_IN_OUT_AT + 20].copy_from_slice(&5u32.to_le_bytes());
        assert_eq!(Header::read(&h).op_len(), Some(0));
        // A length shorter than its parts is refused, not wrapped.
        h[0..4].copy_from_slice(&10u32.to_le_bytes());
        assert_eq!(Header::read(&h).op_len(), None);
    }

    /// A `WRITE` as /dev/fuse gives it: header, `fuse_write_in`, bytes.
    #[test]
    fn a_request_from_the_device_is_split_by_its_opcode() {
        let whole = (IN_HEADER + 40 + 5) as u32;
        let mut b = vec![0u8; whole as usize];
        b[0..4].copy_from_slice(&whole.to_le_bytes());
        b[4..8].copy_from_slice(&16u32.to_le_bytes());
        b[8..16].copy_from_slice(&77u64.to_le_bytes());
        b[16..24].copy_from_slice(&9u64.to_le_bytes());
        b[24..28].copy_from_slice(&1000u32.to_le_bytes());
        let h = Header::read_device(&b).expect("a whole request");
        assert_eq!((h.opcode, h.unique, h.node, h.uid, h.payload), (16, 77, 9, 1000, 5));
        assert_eq!(h.len as usize - IN_HEADER - h.payload as usize, 40);
        // Shorter than its opcode's header, or than its stated length, or
        // than a FUSE header: refused, not wrapped.
        b[0..4].copy_from_slice(&(IN_HEADER as u32 + 8).to_le_bytes());
        assert_eq!(Header::read_device(&b), None);
        b[0..4].copy_from_slice(&(whole + 1).to_le_bytes());
        assert_eq!(Header::read_device(&b), None);
        assert_eq!(Header::read_device(&b[..20]), None);
        // A lookup is all payload; an opcode the table does not know is
        // read (to be answered ENOSYS) with all of it as payload.
        b[0..4].copy_from_slice(&(IN_HEADER as u32 + 3).to_le_bytes());
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(Header::read_device(&b).map(|h| h.payload), Some(3));
        b[4..8].copy_from_slice(&4000u32.to_le_bytes());
        assert_eq!(Header::read_device(&b).map(|h| h.payload), Some(3));
    }

    #[test]
    fn a_reply_names_its_request_and_its_payload() {
        let mut h = vec![0xffu8; REQ_HEADER];
        write_reply(&mut h, 42, -2, 0);
        assert_eq!(u32_at(&h, 0), 16);
        assert_eq!(u32_at(&h, 4) as i32, -2);
        assert_eq!(u64_at(&h, 8), 42);
        assert_eq!(u32_at(&h, ENT_IN_OUT_AT + 16), 0);
        write_reply(&mut h, 43, 0, 4096);
        assert_eq!(u32_at(&h, 0), 16 + 4096);
        assert_eq!(u32_at(&h, ENT_IN_OUT_AT + 16), 4096);
    }

    #[test]
    fn the_command_carries_queue_and_commit() {
        let c = command(3, 0xabcd);
        assert_eq!(u64_at(&c, 0), 0);
        assert_eq!(u64_at(&c, 8), 0xabcd);
        assert_eq!(u16::from_le_bytes([c[16], c[17]]), 3);
    }
}
