//! parcache-client: the node's client library. It resolves paths through
//! the metadata server and moves file bytes to and from the data servers,
//! striped as the file's layout says, with the requests to different
//! servers in flight at once.
//!
//! Not yet here (see the data-path issue): the node cache driven by
//! `parcache-core`. Every call goes to the servers; a write returns once the
//! data servers hold it in their durable logs, so `fsync` has nothing left
//! to push and a program that exits normally loses nothing.

use bytes::{Bytes, BytesMut};
use parcache_core::StripeLayout;
use parcache_proto::{
    Attr, Client, ConnError, DirEntry, ErrorCode, FileKind, Request, Response, Secret, SetAttr, ROOT,
};
use std::time::Duration;
use thiserror::Error;
use tokio::sync::Mutex;

#[derive(Debug, Error)]
pub enum FsError {
    #[error("{path}: {message}")]
    Remote {
        path: String,
        code: ErrorCode,
        message: String,
    },
    #[error(transparent)]
    Conn(#[from] ConnError),
    #[error("data server {server} ({addr}) is unreachable after {tries} tries: {reason}")]
    ServerDown {
        server: u32,
        addr: String,
        tries: u32,
        reason: String,
    },
    #[error("{0}")]
    Protocol(String),
}

impl FsError {
    /// The POSIX errno for this error.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Remote { code, .. } => code.errno(),
            _ => 5,
        }
    }
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            FsError::Remote { code, .. } => Some(*code),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, FsError>;

/// How often and how long to retry a data server that went away: six
/// tries, 250 ms apart and growing, about four seconds in all.
pub const DEFAULT_RETRIES: u32 = 6;
const RETRY_PAUSE: Duration = Duration::from_millis(250);

struct Iod {
    addr: String,
    conn: Mutex<Option<Client>>,
}

/// A connection to a parcache cluster.
pub struct Fs {
    mds: Client,
    iods: Vec<Iod>,
    secret: Secret,
    retries: u32,
}

fn layout_of(a: &Attr) -> Result<(StripeLayout, Vec<u32>)> {
    let l = a
        .layout
        .as_ref()
        .ok_or_else(|| FsError::Protocol(format!("handle {} has no layout", a.handle)))?;
    Ok((
        StripeLayout::new(l.stripe_unit, l.servers.len() as u32),
        l.servers.clone(),
    ))
}

impl Fs {
    /// Connects to the metadata server, then to every data server it names.
    pub async fn connect(mds_addr: &str, secret: &Secret) -> Result<Fs> {
        let mds = Client::connect(mds_addr, secret).await?;
        let addrs = match mds.call(&Request::Servers, &[]).await?.0 {
            Response::Servers(a) => a,
            other => return Err(FsError::Protocol(format!("unexpected reply to Servers: {other:?}"))),
        };
        let iods = addrs
            .into_iter()
            .map(|addr| Iod {
                addr,
                conn: Mutex::new(None),
            })
            .collect();
        Ok(Fs {
            mds,
            iods,
            secret: secret.clone(),
            retries: DEFAULT_RETRIES,
        })
    }

    /// How many times to try a data server before giving up (at least 1).
    pub fn set_retries(&mut self, n: u32) {
        self.retries = n.max(1);
    }

    /// Number of data servers.
    pub fn servers(&self) -> usize {
        self.iods.len()
    }

    async fn md(&self, path: &str, req: Request) -> Result<Response> {
        match self.mds.call(&req, &[]).await?.0 {
            Response::Error(e) => Err(FsError::Remote {
                path: path.to_string(),
                code: e.code,
                message: e.message,
            }),
            r => Ok(r),
        }
    }

    async fn md_attr(&self, path: &str, req: Request) -> Result<Attr> {
        match self.md(path, req).await? {
            Response::Attr(a) => Ok(a),
            other => Err(FsError::Protocol(format!("{path}: unexpected reply {other:?}"))),
        }
    }

    /// Calls data server `i`, reconnecting (a bounded number of times) if it went away.
    async fn iod(&self, i: u32, req: &Request, data: &[u8]) -> Result<(Response, Bytes)> {
        let iod = self.iods.get(i as usize).ok_or_else(|| {
            FsError::Protocol(format!(
                "layout names data server {i}, the cluster has {}",
                self.iods.len()
            ))
        })?;
        let mut last = String::new();
        for attempt in 0..self.retries {
            if attempt > 0 {
                tokio::time::sleep(RETRY_PAUSE * attempt).await;
            }
            let conn = {
                let mut g = iod.conn.lock().await;
                match g.as_ref().filter(|c| !c.is_closed()) {
                    Some(c) => c.clone(),
                    None => match Client::connect(&iod.addr, &self.secret).await {
                        Ok(c) => {
                            *g = Some(c.clone());
                            c
                        }
                        Err(e) => {
                            last = e.to_string();
                            continue;
                        }
                    },
                }
            };
            match conn.call(req, data).await {
                Ok(r) => return Ok(r),
                Err(e) => {
                    tracing::warn!("data server {i} ({}): {e}; retrying", iod.addr);
                    last = e.to_string();
                }
            }
        }
        Err(FsError::ServerDown {
            server: i,
            addr: iod.addr.clone(),
            tries: self.retries,
            reason: last,
        })
    }

    /// Resolves an absolute path (symbolic links in the middle are not followed).
    pub async fn resolve(&self, path: &str) -> Result<Attr> {
        let mut cur = self.md_attr(path, Request::GetAttr { handle: ROOT }).await?;
        for name in path.split('/').filter(|c| !c.is_empty()) {
            if cur.kind != FileKind::Dir {
                return Err(FsError::Remote {
                    path: path.into(),
                    code: ErrorCode::NotDir,
                    message: format!("'{name}' is under something that is not a directory"),
                });
            }
            cur = self
                .md_attr(
                    path,
                    Request::Lookup {
                        parent: cur.handle,
                        name: name.to_string(),
                    },
                )
                .await?;
        }
        Ok(cur)
    }

    /// The parent directory of `path` and the last name.
    pub async fn parent(&self, path: &str) -> Result<(Attr, String)> {
        let p = path.trim_end_matches('/');
        let (dir, name) = p.rsplit_once('/').unwrap_or(("", p));
        if name.is_empty() {
            return Err(FsError::Remote {
                path: path.into(),
                code: ErrorCode::Invalid,
                message: "the root has no parent".into(),
            });
        }
        Ok((
            self.resolve(if dir.is_empty() { "/" } else { dir }).await?,
            name.to_string(),
        ))
    }

    pub async fn getattr(&self, handle: u64) -> Result<Attr> {
        self.md_attr(&format!("handle {handle}"), Request::GetAttr { handle })
            .await
    }

    pub async fn create(&self, path: &str, mode: u32, exclusive: bool) -> Result<Attr> {
        let (dir, name) = self.parent(path).await?;
        self.md_attr(
            path,
            Request::Create {
                parent: dir.handle,
                name,
                mode,
                exclusive,
            },
        )
        .await
    }

    pub async fn mkdir(&self, path: &str, mode: u32) -> Result<Attr> {
        let (dir, name) = self.parent(path).await?;
        self.md_attr(
            path,
            Request::Mkdir {
                parent: dir.handle,
                name,
                mode,
            },
        )
        .await
    }

    pub async fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let d = self.resolve(path).await?;
        match self.md(path, Request::ReadDir { handle: d.handle }).await? {
            Response::Entries(e) => Ok(e),
            other => Err(FsError::Protocol(format!("{path}: unexpected reply {other:?}"))),
        }
    }

    /// Removes a file; its data goes from the data servers when its last link does.
    pub async fn unlink(&self, path: &str) -> Result<()> {
        let (dir, name) = self.parent(path).await?;
        if let Response::Attr(gone) = self
            .md(
                path,
                Request::Unlink {
                    parent: dir.handle,
                    name,
                },
            )
            .await?
        {
            self.remove_data(&gone).await?;
        }
        Ok(())
    }

    pub async fn rmdir(&self, path: &str) -> Result<()> {
        let (dir, name) = self.parent(path).await?;
        self.md(
            path,
            Request::Rmdir {
                parent: dir.handle,
                name,
            },
        )
        .await
        .map(|_| ())
    }

    /// Renames, replacing an existing target (whose data goes if it was the last link).
    pub async fn rename(&self, from: &str, to: &str) -> Result<()> {
        let (d1, n1) = self.parent(from).await?;
        let (d2, n2) = self.parent(to).await?;
        if let Response::Attr(gone) = self
            .md(
                from,
                Request::Rename {
                    parent: d1.handle,
                    name: n1,
                    new_parent: d2.handle,
                    new_name: n2,
                },
            )
            .await?
        {
            self.remove_data(&gone).await?;
        }
        Ok(())
    }

    async fn remove_data(&self, a: &Attr) -> Result<()> {
        if let Some(l) = &a.layout {
            for &s in &l.servers {
                self.iod(s, &Request::Remove { handle: a.handle }, &[]).await?;
            }
        }
        Ok(())
    }

    pub async fn set_policy(&self, path: &str, key: &str, value: &str) -> Result<Vec<(String, String)>> {
        let a = self.resolve(path).await?;
        match self
            .md(
                path,
                Request::SetPolicy {
                    handle: a.handle,
                    key: key.into(),
                    value: value.into(),
                },
            )
            .await?
        {
            Response::Policies(p) => Ok(p),
            other => Err(FsError::Protocol(format!("{path}: unexpected reply {other:?}"))),
        }
    }

    pub async fn get_policy(&self, path: &str) -> Result<Vec<(String, String)>> {
        let a = self.resolve(path).await?;
        match self.md(path, Request::GetPolicy { handle: a.handle }).await? {
            Response::Policies(p) => Ok(p),
            other => Err(FsError::Protocol(format!("{path}: unexpected reply {other:?}"))),
        }
    }

    /// Sets a file's size: the data servers cut or extend their parts.
    pub async fn truncate(&self, a: &Attr, size: u64) -> Result<Attr> {
        let (layout, servers) = layout_of(a)?;
        for (pos, &s) in servers.iter().enumerate() {
            let len = layout.server_bytes(size, pos as u32);
            self.iod(s, &Request::Truncate { handle: a.handle, len }, &[]).await?;
        }
        self.md_attr(
            &format!("handle {}", a.handle),
            Request::SetAttr {
                handle: a.handle,
                set: SetAttr {
                    size: Some(size),
                    ..SetAttr::default()
                },
            },
        )
        .await
    }

    /// Writes `data` at `offset`. Each data server gets one request (its
    /// chunks of the range are contiguous on it), all in flight at once;
    /// returns when every one holds its part durably.
    pub async fn write_at(&self, a: &Attr, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let (layout, servers) = layout_of(a)?;
        let mut parts: Vec<Option<(u64, BytesMut)>> = vec![None; servers.len()];
        for c in layout.chunks(offset, data.len() as u64) {
            let slice = &data[(c.file_offset - offset) as usize..(c.file_offset - offset + c.len) as usize];
            let part = &mut parts[c.server as usize];
            match part {
                Some((_, buf)) => buf.extend_from_slice(slice),
                None => *part = Some((c.server_offset, BytesMut::from(slice))),
            }
        }
        let calls = parts.into_iter().enumerate().filter_map(|(pos, p)| {
            let (server_offset, buf) = p?;
            let req = Request::Write {
                handle: a.handle,
                offset: server_offset,
            };
            let s = servers[pos];
            Some(async move {
                match self.iod(s, &req, &buf).await? {
                    (Response::Written { .. }, _) => Ok(()),
                    (Response::Error(e), _) => Err(FsError::Remote {
                        path: format!("handle {}", a.handle),
                        code: e.code,
                        message: format!("data server {s}: {}", e.message),
                    }),
                    (other, _) => Err(FsError::Protocol(format!("unexpected reply to Write: {other:?}"))),
                }
            })
        });
        for r in join_all(calls).await {
            r?;
        }
        self.md_attr(
            &format!("handle {}", a.handle),
            Request::Written {
                handle: a.handle,
                size: offset + data.len() as u64,
            },
        )
        .await?;
        Ok(())
    }

    /// Reads up to `len` bytes at `offset` of a file whose size is `a.size`
    /// (holes read as zeros), one request per data server, all at once.
    pub async fn read_at(&self, a: &Attr, offset: u64, len: u64) -> Result<Vec<u8>> {
        let end = a.size.min(offset.saturating_add(len));
        if offset >= end {
            return Ok(Vec::new());
        }
        let (layout, servers) = layout_of(a)?;
        let chunks: Vec<_> = layout.chunks(offset, end - offset).collect();
        let mut spans: Vec<Option<(u64, u64)>> = vec![None; servers.len()];
        for c in &chunks {
            let s = &mut spans[c.server as usize];
            match s {
                Some((_, n)) => *n += c.len,
                None => *s = Some((c.server_offset, c.len)),
            }
        }
        let calls = spans.iter().enumerate().map(|(pos, sp)| {
            let s = servers[pos];
            let sp = *sp;
            async move {
                let Some((off, n)) = sp else { return Ok(Bytes::new()) };
                match self
                    .iod(
                        s,
                        &Request::Read {
                            handle: a.handle,
                            offset: off,
                            len: n,
                        },
                        &[],
                    )
                    .await?
                {
                    (Response::Data { .. }, d) => Ok(d),
                    (Response::Error(e), _) => Err(FsError::Remote {
                        path: format!("handle {}", a.handle),
                        code: e.code,
                        message: format!("data server {s}: {}", e.message),
                    }),
                    (other, _) => Err(FsError::Protocol(format!("unexpected reply to Read: {other:?}"))),
                }
            }
        });
        let got: Vec<Bytes> = join_all(calls).await.into_iter().collect::<Result<_>>()?;
        let mut out = vec![0u8; (end - offset) as usize];
        let mut used = vec![0u64; servers.len()];
        for c in &chunks {
            let src = &got[c.server as usize];
            let from = used[c.server as usize] as usize;
            used[c.server as usize] += c.len;
            let dst = (c.file_offset - offset) as usize;
            let have = src.len().saturating_sub(from).min(c.len as usize);
            out[dst..dst + have].copy_from_slice(&src[from..from + have]);
        }
        Ok(out)
    }
}

/// Runs futures concurrently on this task and collects their results in order.
async fn join_all<F: std::future::Future>(fs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futs: Vec<_> = fs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futs.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.expect("every future finished")).collect()
}
