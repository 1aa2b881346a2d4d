//! The namespace: paths and names resolved at the metadata server, files
//! and directories made and removed, extended attributes, and the policy
//! settings of files and directories.

use crate::{Fs, FsError, Result};
use parcache_core::bypass::hints::HintList;
use parcache_core::FilePolicies;
use parcache_proto::{show_name, Attr, DirEntry, EntryPlus, ErrorCode, FileKind, Request, Response, SetAttr, ROOT};

impl Fs {
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
                        name: name.as_bytes().to_vec(),
                    },
                )
                .await?;
        }
        self.name(&cur, path);
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
                message: "the root directory is always there: it cannot be made, removed, renamed or linked".into(),
            });
        }
        let d = self.resolve(if dir.is_empty() { "/" } else { dir }).await?;
        if d.kind != FileKind::Dir {
            // Said here with its path: the server knows only a handle.
            return Err(FsError::Remote {
                path: path.into(),
                code: ErrorCode::NotDir,
                message: format!("'{dir}' is not a directory"),
            });
        }
        Ok((d, name.to_string()))
    }

    pub async fn getattr(&self, handle: u64) -> Result<Attr> {
        let a = self.md_attr(&self.what(handle), Request::GetAttr { handle }).await?;
        self.seen(&a);
        Ok(a)
    }

    pub async fn create(&self, path: &str, mode: u32, exclusive: bool) -> Result<Attr> {
        let (dir, name) = self.parent(path).await?;
        let a = self.create_at(dir.handle, name.as_bytes(), mode, exclusive).await?;
        self.name(&a, path);
        Ok(a)
    }

    pub async fn mkdir(&self, path: &str, mode: u32) -> Result<Attr> {
        let (dir, name) = self.parent(path).await?;
        self.mkdir_at(dir.handle, name.as_bytes(), mode).await
    }

    pub async fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let d = self.resolve(path).await?;
        self.readdir_handle(d.handle).await
    }

    /// Removes a file; its data goes from the data servers when its last link does.
    pub async fn unlink(&self, path: &str) -> Result<()> {
        let (dir, name) = self.parent(path).await?;
        self.unlink_at(dir.handle, name.as_bytes()).await
    }

    pub async fn rmdir(&self, path: &str) -> Result<()> {
        let (dir, name) = self.parent(path).await?;
        self.rmdir_at(dir.handle, name.as_bytes()).await.map(|_| ())
    }

    /// Renames, replacing an existing target (whose data goes if it was the last link).
    pub async fn rename(&self, from: &str, to: &str) -> Result<()> {
        let (d1, n1) = self.parent(from).await?;
        let (d2, n2) = self.parent(to).await?;
        self.rename_at(d1.handle, n1.as_bytes(), d2.handle, n2.as_bytes()).await
    }

    // Handle-based calls, as a mount sees the namespace: (directory, name).
    // Names are bytes (any but `/` and NUL), as the kernel gives them.

    /// The entry `name` of directory `parent`.
    pub async fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let req = Request::Lookup {
            parent,
            name: name.to_vec(),
        };
        let shown = show_name(name);
        let a = self.md_attr(&shown, req).await?;
        self.name(&a, &shown);
        Ok(a)
    }

    /// [`Fs::lookup`], with the file's policies in the same answer (what
    /// [`Fs::open_known`] needs).
    pub async fn lookup_with_policies(&self, parent: u64, name: &[u8]) -> Result<(Attr, Vec<(String, String)>)> {
        let req = Request::LookupPolicy {
            parent,
            name: name.to_vec(),
        };
        let shown = show_name(name);
        match self.md(&shown, req).await? {
            Response::AttrPolicies {
                attr,
                policies,
                content,
            } => {
                self.name(&attr, &shown);
                self.keep_small(&attr, content);
                Ok((attr, policies))
            }
            other => Err(FsError::Protocol(format!("{shown}: unexpected reply {other:?}"))),
        }
    }

    /// This node's requests to the metadata server that may change its
    /// answers: (sent, ended). Equal: none in flight.
    pub fn metadata_changes(&self) -> (u64, u64) {
        self.mds.changes()
    }

    pub async fn create_at(&self, parent: u64, name: &[u8], mode: u32, exclusive: bool) -> Result<Attr> {
        Ok(self.create_in(parent, name, mode, exclusive).await?.0)
    }

    /// [`Fs::create_at`], with the directory's attributes after the new
    /// name went in (`None` if the file existed).
    pub async fn create_in(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        exclusive: bool,
    ) -> Result<(Attr, Option<Attr>)> {
        self.create_owned(parent, name, mode, exclusive, None).await
    }

    /// [`Fs::create_in`] of a file owned by `owner` (user, group; `None`:
    /// the directory's owner): made behind where this node holds the
    /// directory ([`Fs::create_behind`]), which a mount's creates of new
    /// names in a busy directory are.
    pub async fn create_owned(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        owner: Option<(u32, u32)>,
    ) -> Result<(Attr, Option<Attr>)> {
        if let Some((attr, dir)) = self.create_behind(parent, name, mode, owner).await? {
            return Ok((attr, dir));
        }
        let req = Request::Create {
            parent,
            name: name.to_vec(),
            mode,
            exclusive,
        };
        let shown = show_name(name);
        match self.md(&shown, req).await? {
            Response::Created { attr, policies, parent } => {
                self.name(&attr, &shown);
                self.learn(&attr, &policies)?;
                if parent.is_some() {
                    // Made by this request, not found there.
                    self.data.created(attr.handle);
                }
                Ok((attr, parent))
            }
            other => Err(FsError::Protocol(format!("{shown}: unexpected reply {other:?}"))),
        }
    }

    pub async fn mkdir_at(&self, parent: u64, name: &[u8], mode: u32) -> Result<Attr> {
        let req = Request::Mkdir {
            parent,
            name: name.to_vec(),
            mode,
        };
        self.md_attr(&show_name(name), req).await
    }

    /// A special file (fifo, character or block device, socket): metadata
    /// only, never opened through the data path.
    pub async fn mknod_at(&self, parent: u64, name: &[u8], mode: u32, kind: FileKind, rdev: u32) -> Result<Attr> {
        let req = Request::Mknod {
            parent,
            name: name.to_vec(),
            mode,
            kind,
            rdev,
        };
        self.md_attr(&show_name(name), req).await
    }

    /// Every entry of a directory, fetched in pages (a directory of any
    /// size lists whole).
    pub async fn readdir_handle(&self, handle: u64) -> Result<Vec<DirEntry>> {
        Ok(self.list_entries(handle, usize::MAX).await?.unwrap_or_default())
    }

    /// Directory `dir`'s entries, fetched in pages; `None` if it holds
    /// more than `most`.
    pub(crate) async fn list_entries(&self, dir: u64, most: usize) -> Result<Option<Vec<DirEntry>>> {
        let what = format!("directory {}", self.what(dir));
        let mut all: Vec<DirEntry> = Vec::new();
        loop {
            let after = all.last().map(|e| e.name.clone());
            match self.md(&what, Request::ReadDir { handle: dir, after }).await? {
                Response::Entries { entries, more } => {
                    let progressed = !entries.is_empty();
                    all.extend(entries);
                    if all.len() > most {
                        return Ok(None);
                    }
                    if !more || !progressed {
                        return Ok(Some(all));
                    }
                }
                other => return Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
            }
        }
    }

    /// Takes a lease on directory `dir`'s names (a mount only: every other
    /// node's change of them calls this node back first), then lists them;
    /// `None` if the directory holds more than `most` names (not worth
    /// keeping). Names this node adds meanwhile may be missing: the caller
    /// keeps track of those.
    pub async fn watch_dir(&self, dir: u64, most: usize) -> Result<Option<Vec<Vec<u8>>>> {
        let what = format!("directory {}", self.what(dir));
        self.md_attr(&what, Request::WatchDir { dir }).await?;
        let entries = self.list_entries(dir, most).await?;
        Ok(entries.map(|e| e.into_iter().map(|e| e.name).collect()))
    }

    /// A page of the files named in directory `dir` after `after`, each as
    /// [`Fs::lookup_with_policies`] would answer it, under a lease for this
    /// node (`ReadDirPlus`), and where the next page starts (`None`: this
    /// was the last). Take each answer with [`Fs::looked_up`] when its
    /// name is looked up.
    pub async fn read_dir_plus(&self, dir: u64, after: Option<Vec<u8>>) -> Result<(Vec<EntryPlus>, Option<Vec<u8>>)> {
        let what = format!("directory {}", self.what(dir));
        match self.md(&what, Request::ReadDirPlus { dir, after }).await? {
            Response::EntriesPlus { entries, more } => Ok((entries, more)),
            other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    /// Takes a lookup's answer got ahead of it ([`Fs::read_dir_plus`]) as
    /// [`Fs::lookup_with_policies`] takes the server's: the file's name,
    /// and a small file's content for the open after.
    pub fn looked_up(&self, attr: &Attr, name: &[u8], content: Option<Vec<u8>>) {
        self.name(attr, &show_name(name));
        self.keep_small(attr, content);
    }

    /// Removes a name. A file open on this node keeps its data until the
    /// last open here ends (POSIX), as an orphan at the metadata server.
    pub async fn unlink_at(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.unlink_in(parent, name).await.map(|_| ())
    }

    /// Removes `name` from directory `parent`; returns the directory's
    /// attributes after.
    pub async fn unlink_in(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let mut keep_open = false;
        if self.any_open() {
            if let Ok(a) = self.lookup(parent, name).await {
                keep_open = self.orphan_if_open(a.handle);
            }
        }
        let req = Request::Unlink {
            parent,
            name: name.to_vec(),
            keep_open,
            only: None,
        };
        match self.md(&show_name(name), req).await? {
            Response::Unlinked { gone, parent } => {
                if let Some(gone) = gone {
                    self.remove_data(&gone).await?;
                }
                Ok(parent)
            }
            other => Err(FsError::Protocol(format!(
                "{}: unexpected reply to an unlink {other:?}",
                show_name(name)
            ))),
        }
    }

    /// Removes an empty directory; the parent's attributes after, if the
    /// metadata server gave them.
    pub async fn rmdir_at(&self, parent: u64, name: &[u8]) -> Result<Option<Attr>> {
        let req = Request::Rmdir {
            parent,
            name: name.to_vec(),
        };
        Ok(match self.md(&show_name(name), req).await? {
            Response::Unlinked { parent, .. } => Some(parent),
            _ => None,
        })
    }

    pub async fn rename_at(&self, parent: u64, name: &[u8], new_parent: u64, new_name: &[u8]) -> Result<()> {
        let req = Request::Rename {
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
        };
        if let Response::Attr(gone) = self.md(&show_name(name), req).await? {
            self.remove_data(&gone).await?;
        }
        Ok(())
    }

    pub async fn symlink_at(&self, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr> {
        let req = Request::Symlink {
            parent,
            name: name.to_vec(),
            target: target.to_vec(),
        };
        self.md_attr(&show_name(name), req).await
    }

    pub async fn readlink(&self, handle: u64) -> Result<Vec<u8>> {
        let what = self.what(handle);
        match self.md(&what, Request::ReadLink { handle }).await? {
            Response::Target(t) => Ok(t),
            other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    /// A hard link to `handle` as `new_name` in `new_parent`.
    pub async fn link_at(&self, handle: u64, new_parent: u64, new_name: &[u8]) -> Result<Attr> {
        let req = Request::Link {
            handle,
            new_parent,
            new_name: new_name.to_vec(),
        };
        self.md_attr(&show_name(new_name), req).await
    }

    /// Sets extended attribute `name` (`flags`: 1 create only, 2 replace only).
    pub async fn set_xattr(&self, handle: u64, name: &str, value: &[u8], flags: u32) -> Result<()> {
        let req = Request::SetXattr {
            handle,
            name: name.into(),
            flags,
        };
        let what = self.what(handle);
        match self.mds.call(&req, value).await?.0 {
            Response::Ok => Ok(()),
            Response::Error(e) => Err(FsError::Remote {
                path: what,
                code: e.code,
                message: e.message,
            }),
            other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    pub async fn get_xattr(&self, handle: u64, name: &str) -> Result<Vec<u8>> {
        let what = self.what(handle);
        let req = Request::GetXattr {
            handle,
            name: name.into(),
        };
        match self.mds.call(&req, &[]).await? {
            (Response::Data { .. }, v) => Ok(v.to_vec()),
            (Response::Error(e), _) => Err(FsError::Remote {
                path: what,
                code: e.code,
                message: e.message,
            }),
            (other, _) => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    pub async fn list_xattr(&self, handle: u64) -> Result<Vec<String>> {
        let what = self.what(handle);
        match self.md(&what, Request::ListXattr { handle }).await? {
            Response::Names(n) => Ok(n),
            other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    pub async fn remove_xattr(&self, handle: u64, name: &str) -> Result<()> {
        let req = Request::RemoveXattr {
            handle,
            name: name.into(),
        };
        self.md(&self.what(handle), req).await.map(|_| ())
    }

    /// A file's policy settings with where each came from: (key, value,
    /// inherited from its directory at create).
    pub async fn policy_origins(&self, handle: u64) -> Result<Vec<(String, String, bool)>> {
        let what = self.what(handle);
        match self.md(&what, Request::ExplainPolicy { handle }).await? {
            Response::Origins(o) => Ok(o),
            other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    /// A file's or directory's effective policies, (key, value, origin),
    /// sorted by key: each set on it (`"set"`), copied from its directory
    /// when it was made (`"inherited"`), or the node cache's default
    /// (`"default"`).
    pub async fn effective_policies(&self, handle: u64) -> Result<Vec<(String, String, &'static str)>> {
        let mut all: Vec<(String, String, &'static str)> = self
            .policy_origins(handle)
            .await?
            .into_iter()
            .map(|(k, v, inherited)| (k, v, if inherited { "inherited" } else { "set" }))
            .collect();
        let set: Vec<(String, String)> = all.iter().map(|(k, v, _)| (k.clone(), v.clone())).collect();
        for (k, v) in FilePolicies::from_settings(&set).node_settings() {
            if !all.iter().any(|(key, _, _)| *key == k) {
                all.push((k.to_string(), v, "default"));
            }
        }
        all.sort();
        Ok(all)
    }

    /// Removes a policy setting: the file or directory falls back to the
    /// default (the node cache drops what it held under the old policy).
    pub async fn unset_policy_handle(&self, handle: u64, key: &str) -> Result<Vec<(String, String)>> {
        let what = self.what(handle);
        let req = Request::UnsetPolicy {
            handle,
            key: key.into(),
        };
        match self.md(&what, req).await? {
            Response::Policies(p) if key == "bypass" => {
                self.global.learn(handle, &p, self.cache.block_size);
                Ok(p)
            }
            Response::Policies(p) => {
                self.forget_policies(handle).await?;
                Ok(p)
            }
            other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    /// Sets a policy of a file or directory by handle (see [`Fs::set_policy`]).
    pub async fn set_policy_handle(&self, handle: u64, key: &str, value: &str) -> Result<Vec<(String, String)>> {
        let what = self.what(handle);
        let req = Request::SetPolicy {
            handle,
            key: key.into(),
            value: value.into(),
        };
        match self.md(&what, req).await? {
            // Hints change where requests go, not what the cache holds.
            Response::Policies(p) if key == "bypass" => {
                self.global.learn(handle, &p, self.cache.block_size);
                Ok(p)
            }
            Response::Policies(p) => {
                self.forget_policies(handle).await?;
                Ok(p)
            }
            other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    /// Adds bypass hints to a file or directory (Vilayannur et al. 2003
    /// §3: per segment, per operation and per level, whether requests go
    /// through the node's cache and the global cache), after the ones it
    /// has: where they overlap, these win. Returns all of its hints.
    pub async fn hint(&self, path: &str, rules: &HintList) -> Result<HintList> {
        let mut all = self.hints(path).await?;
        all.extend(rules);
        self.set_policy(path, "bypass", &all.to_string()).await?;
        Ok(all)
    }

    /// A file's or directory's bypass hints (none: every request goes
    /// through every cache).
    pub async fn hints(&self, path: &str) -> Result<HintList> {
        let set = self.get_policy(path).await?;
        Ok(set
            .iter()
            .find(|(k, _)| k == "bypass")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_default())
    }

    /// Removes every bypass hint set on a file or directory (none set:
    /// nothing to do).
    pub async fn clear_hints(&self, path: &str) -> Result<()> {
        let a = self.resolve(path).await?;
        let set = self.get_policy_handle(a.handle).await?;
        if set.iter().any(|(k, _)| k == "bypass") {
            self.unset_policy_handle(a.handle, "bypass").await?;
        }
        Ok(())
    }

    pub async fn get_policy_handle(&self, handle: u64) -> Result<Vec<(String, String)>> {
        let what = self.what(handle);
        match self.md(&what, Request::GetPolicy { handle }).await? {
            Response::Policies(p) => Ok(p),
            other => Err(FsError::Protocol(format!("{what}: unexpected reply {other:?}"))),
        }
    }

    /// Changes mode, owner or times (a size goes through [`Fs::truncate`]).
    pub async fn setattr(&self, handle: u64, set: SetAttr) -> Result<Attr> {
        self.md_attr(&self.what(handle), Request::SetAttr { handle, set }).await
    }

    pub async fn set_policy(&self, path: &str, key: &str, value: &str) -> Result<Vec<(String, String)>> {
        let a = self.resolve(path).await?;
        self.set_policy_handle(a.handle, key, value).await.map_err(|e| match e {
            FsError::Remote { code, message, .. } => FsError::Remote {
                path: path.to_string(),
                code,
                message,
            },
            e => e,
        })
    }

    pub async fn get_policy(&self, path: &str) -> Result<Vec<(String, String)>> {
        let a = self.resolve(path).await?;
        match self.md(path, Request::GetPolicy { handle: a.handle }).await? {
            Response::Policies(p) => Ok(p),
            other => Err(FsError::Protocol(format!("{path}: unexpected reply {other:?}"))),
        }
    }
}
