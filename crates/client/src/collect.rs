//! Collection of parts no file owns: a data server keeps a file's part
//! until it is told to remove it, so a part whose removal never came (the
//! unlinking node died first) or whose file the metadata server lost in a
//! crash (a create not yet durable) stays as used space. `parcache gc`
//! finds them: each data server lists its parts, the metadata server says
//! which handles name no file, and those parts are removed. Handles are
//! never given twice (the metadata server reserves them durably), so a
//! handle it does not know can never come back to own the part.

use crate::data::server_error;
use crate::{Fs, FsError, Result};
use parcache_proto::{Request, Response, LIST_PARTS_PAGE};

/// Handles asked about in one `UnknownHandles` request.
const ASK_MAX: usize = 4096;

impl Fs {
    /// Ends the files unlinked while open on a node (a mount) whose
    /// connection to the metadata server closed at least `older_than_secs`
    /// ago and that has not been heard from since: the node died before
    /// its last close of them. Their parts are then parts no file owns
    /// ([`Fs::collect_parts`]). Returns how many ended.
    pub async fn drop_orphans(&self, older_than_secs: u64) -> Result<u64> {
        match self.md("collection", Request::DropOrphans { older_than_secs }).await? {
            Response::Handles(h) => Ok(h.len() as u64),
            other => Err(FsError::Protocol(format!("unexpected reply to DropOrphans: {other:?}"))),
        }
    }

    /// Removes, from every data server, the parts last written at least
    /// `older_than_secs` ago whose handle names no file at the metadata
    /// server (younger ones may belong to a create on its way). Returns
    /// (parts looked at, parts removed).
    pub async fn collect_parts(&self, older_than_secs: u64) -> Result<(u64, u64)> {
        let (mut seen, mut removed) = (0, 0);
        for s in 0..self.data.servers() as u32 {
            let mut after = None;
            loop {
                let req = Request::ListParts { older_than_secs, after };
                let listed = match self.data.call(s, &req, &[]).await? {
                    (Response::Handles(h), _) => h,
                    (Response::Error(e), _) => return Err(server_error("collection", s, e)),
                    (other, _) => {
                        return Err(FsError::Protocol(format!(
                            "data server {s}: unexpected reply to ListParts: {other:?}"
                        )))
                    }
                };
                seen += listed.len() as u64;
                after = listed.last().copied();
                for batch in listed.chunks(ASK_MAX) {
                    let req = Request::UnknownHandles {
                        handles: batch.to_vec(),
                    };
                    let unknown = match self.md("collection", req).await? {
                        Response::Handles(h) => h,
                        other => {
                            return Err(FsError::Protocol(format!(
                                "unexpected reply to UnknownHandles: {other:?}"
                            )))
                        }
                    };
                    for h in unknown {
                        match self.data.call(s, &Request::Remove { handle: h }, &[]).await? {
                            (Response::Ok, _) => removed += 1,
                            (Response::Error(e), _) => return Err(server_error("collection", s, e)),
                            (other, _) => {
                                return Err(FsError::Protocol(format!(
                                    "data server {s}: unexpected reply to Remove: {other:?}"
                                )))
                            }
                        }
                    }
                }
                if listed.len() < LIST_PARTS_PAGE {
                    break;
                }
            }
        }
        Ok((seen, removed))
    }
}
