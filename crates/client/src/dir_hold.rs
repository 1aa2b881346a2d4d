//! Write-behind unlinks: the node's half of an exclusive hold on a
//! directory (`parcache_core::consistency::dir_hold`).
//!
//! While this node holds a directory alone, and knows its names, an unlink
//! there of a name it knows is answered at once and sent after (as a
//! write-back cache answers a write before the disk has it, Gray &
//! Cheriton's write lease, 1989 §2). Every other request this node makes
//! to the metadata server waits until those unlinks are answered, so it
//! sees them; another node's request that touches the directory calls this
//! node back first, and the callback is answered only once they are. The
//! kernel serialises unlinks in a directory, so without this a removal
//! costs a whole round trip to the metadata server (mdtest's remove phase).

use crate::files::view;
use crate::{Fs, FsError, Result};
use parcache_core::consistency::dir_hold::HOLD;
use parcache_proto::{show_name, Attr, Behind, FileKind, Request, Response};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// A hold is used only while this much of it is left, so that an unlink
/// answered now reaches the metadata server long before the hold ends
/// there (the server's clock starts after this node's).
const SLACK: Duration = Duration::from_secs(2);
/// Unlinks answered and not yet done at the metadata server, at most;
/// more wait for the first to be done.
const MOST_PENDING: usize = 64;
/// Names of a directory this node lists to hold it, at most.
const MOST_NAMES: usize = 16_384;
/// A directory is asked for at an unlink or create this soon after
/// another there.
const BUSY: Duration = Duration::from_secs(1);
/// Files made behind and not yet made at the metadata server, at most;
/// past it a create is made the usual way (after them).
const MOST_BEHIND: usize = 256;
/// Creates behind sent in one request at most; this many queued are sent
/// at once.
const CREATES_BATCH: usize = 64;
/// How long a create behind waits for others to join it (and for its
/// file's close, which then carries its content in the same request).
const CREATE_WAIT: Duration = Duration::from_millis(2);
/// Handles asked for at a time for creates behind.
const HANDLES_AT_ONCE: u32 = 256;
/// A directory called back is not asked for again for this long (another
/// node is using it: each would call the other back in turn).
const BACK_OFF: Duration = Duration::from_secs(5);

/// A name in a directory (the directory's handle, the name).
type Named<'a> = (u64, &'a [u8]);
/// Unlinks queued in a directory: each name with its file (0: not known).
type Batch = (u64, Vec<(Vec<u8>, u64)>);

/// This node's holds, and its unlinks under way.
#[derive(Default)]
pub(crate) struct DirHolds {
    state: Mutex<State>,
    /// Wakes requests waiting for the unlinks under way to be done.
    done: Notify,
    /// Sends the creates behind queued now, without waiting for more.
    kick: Notify,
}

#[derive(Default)]
struct State {
    held: HashMap<u64, Held>,
    /// Directories being asked for, each with this node's changes of its
    /// names answered meanwhile (the listing may or may not show them);
    /// and when each directory was called back last.
    asking: HashMap<u64, Noted>,
    recalled: HashMap<u64, Instant>,
    /// When an unlink was last made in each directory.
    unlinked: HashMap<u64, Instant>,
    /// Unlinks answered and not yet done at the metadata server.
    pending: usize,
    /// Of those, the ones not sent yet, in order: (directory, name, the
    /// name's file or 0 if not known).
    queued: Vec<(u64, Vec<u8>, u64)>,
    /// A task is sending `queued`.
    sending: bool,
    /// Handles the metadata server gave this node for creates behind.
    handles: Vec<u64>,
    /// Files made here behind, not yet made at the metadata server (queued
    /// or sent), each with its directory; counted in `pending` too.
    behind: HashMap<u64, u64>,
    /// Those not sent yet, in order: (directory, the file).
    creates: Vec<(u64, Behind)>,
    /// A task is sending `creates`.
    creating: bool,
}

/// This node's changes of a directory's names answered while it was being
/// asked for, in order: applied to its listing once held.
#[derive(Default)]
struct Noted {
    /// Each name made (with its file's handle) or removed (`None`).
    names: Vec<(Vec<u8>, Option<u64>)>,
    /// The directory's attributes after the last change, if it gave them.
    attr: Option<Option<Attr>>,
    /// A change refused or lost: what the directory holds is not known.
    lost: bool,
}

/// A directory held: until when, the names in it, and its attributes as
/// this node's changes left them (`None`: unknown).
struct Held {
    until: Instant,
    /// The names of what is not a directory, each with its file's handle
    /// (0: not known).
    names: HashMap<Vec<u8>, u64>,
    /// The names of directories in it (with `names`, every name in it).
    dirs: HashSet<Vec<u8>>,
    attr: Option<Attr>,
    /// The directory's policy settings, which a file made here behind
    /// takes (`None`: not known; no create behind then).
    settings: Option<Vec<(String, String)>>,
}

/// What a held directory is, as a hold's asking found it: the names of
/// files (with handles), the names of directories, its attributes and
/// its policy settings.
pub(crate) type Listing = (
    HashMap<Vec<u8>, u64>,
    HashSet<Vec<u8>>,
    Attr,
    Option<Vec<(String, String)>>,
);

/// A file made behind ([`DirHolds::make`]): its handle, the directory's
/// attributes after (if known), the directory's settings and owner, and
/// whether a sender must be started.
pub(crate) struct Made {
    pub handle: u64,
    /// The data server its layout starts at.
    pub first_server: u32,
    pub parent: Option<Attr>,
    pub settings: Vec<(String, String)>,
    pub owner: (u32, u32),
    pub start: bool,
}

/// Whether files made under these policy settings may be made behind:
/// blocks on the data servers, a private node cache and `close-to-open`,
/// whose open asks the metadata server nothing. Under the others a file's
/// version is in play before its first close (the cooperative tier's
/// homes cache its blocks at it; content-addressed files' hashes and
/// `sprite`'s opens go to the server), and a file made behind has the
/// server's version only once its create is answered.
fn made_behind_under(settings: &[(String, String)]) -> bool {
    use parcache_core::consistency::ConsistencyKind;
    let p = parcache_core::catalogue::FilePolicies::from_settings(settings);
    p.consistency == ConsistencyKind::CloseToOpen
        && p.cooperative == parcache_core::cooperative::CooperativeKind::None
        && p.store == parcache_core::catalogue::StoreKind::Blocks
        && !p.nv
}

/// A held directory's attributes after a change of its names this node
/// made alone (the metadata server's `touch_dir`: modified and changed
/// now, one version on; its clock may differ from this node's by a little).
fn changed_here(a: &mut Attr) {
    let t = parcache_proto::Timestamp::now();
    a.mtime = t;
    a.ctime = t;
    a.version += 1;
}

impl DirHolds {
    /// Takes `name` out of held directory `dir` for an unlink answered
    /// now, if this node holds `dir` with time to spare, knows the name
    /// there and `open` says its file is not open here (with the handle,
    /// or 0 if it is not known); returns the name's file (its handle, 0
    /// if not known) and the directory's attributes after, if known.
    fn take(&self, dir: u64, name: &[u8], open: impl Fn(u64) -> bool) -> Option<(u64, Option<Attr>)> {
        let mut s = self.state.lock();
        if s.pending >= MOST_PENDING {
            return None;
        }
        let h = s.held.get_mut(&dir)?;
        let &handle = h.names.get(name)?;
        if Instant::now() + SLACK >= h.until || open(handle) || s.behind.contains_key(&handle) {
            return None;
        }
        let h = s.held.get_mut(&dir)?;
        h.names.remove(name);
        let attr = h.attr.as_mut().map(|a| {
            changed_here(a);
            a.clone()
        });
        s.pending += 1;
        Some((handle, attr))
    }

    /// Whether `dir` is worth asking for now: an unlink there came
    /// shortly before this one (one alone is not worth a listing), it is
    /// not held with time to spare, not being asked for, not called back
    /// lately. Marks it asked.
    fn ask(&self, dir: u64) -> bool {
        let mut s = self.state.lock();
        let now = Instant::now();
        if s.unlinked.len() > 1024 {
            s.unlinked.clear();
        }
        let before = s.unlinked.insert(dir, now);
        let busy = before.is_some_and(|t| now.duration_since(t) < BUSY);
        let held = s.held.get(&dir).is_some_and(|h| now + SLACK < h.until);
        let lately = s.recalled.get(&dir).is_some_and(|&t| now.duration_since(t) < BACK_OFF);
        if !busy || held || lately || s.asking.contains_key(&dir) {
            return false;
        }
        s.asking.insert(dir, Noted::default());
        true
    }

    /// The end of asking for `dir`: held from `sent` with `names` and
    /// `attr`, with this node's changes answered meanwhile applied, unless
    /// it was called back meanwhile (since `sent`) or one of those changes
    /// failed; if not held, not asked for again for a while.
    fn asked(&self, dir: u64, sent: Instant, got: Option<Listing>) {
        let mut s = self.state.lock();
        let noted = s.asking.remove(&dir).unwrap_or_default();
        let recalled = s.recalled.get(&dir).is_some_and(|&t| t >= sent);
        match got {
            Some((mut names, dirs, attr, settings)) if !recalled && !noted.lost => {
                if s.recalled.len() > 1024 {
                    s.recalled.clear();
                }
                for (name, now) in noted.names {
                    match now {
                        Some(handle) => drop(names.insert(name, handle)),
                        None => drop(names.remove(&name)),
                    }
                }
                s.held.insert(
                    dir,
                    Held {
                        until: sent + Duration::from_nanos(HOLD.0),
                        names,
                        dirs,
                        attr: noted.attr.unwrap_or(Some(attr)),
                        settings,
                    },
                );
            }
            // Refused (a directory too big), failed or called back: not
            // asked for again soon either.
            _ => {
                s.held.remove(&dir);
                s.recalled.insert(dir, Instant::now());
            }
        }
    }

    /// One unlink under way is done.
    fn finished(&self) {
        self.finished_n(1);
    }

    /// `n` unlinks under way are done.
    fn finished_n(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut s = self.state.lock();
        s.pending -= n;
        drop(s);
        self.done.notify_waiters();
    }

    /// Queues an unlink taken ([`DirHolds::take`]) to be sent; whether a
    /// task must be started to send it (none is sending).
    fn queue(&self, dir: u64, name: Vec<u8>, file: u64) -> bool {
        let mut s = self.state.lock();
        s.queued.push((dir, name, file));
        !std::mem::replace(&mut s.sending, true)
    }

    /// The next unlinks to send together: the first queued one's directory
    /// and every name queued in it, in order (`None`: nothing is queued,
    /// and the sender stops).
    fn next_batch(&self) -> Option<Batch> {
        let mut s = self.state.lock();
        let Some(&(dir, _, _)) = s.queued.first() else {
            s.sending = false;
            return None;
        };
        let (same, rest) = std::mem::take(&mut s.queued).into_iter().partition(|q| q.0 == dir);
        s.queued = rest;
        Some((dir, same.into_iter().map(|(_, name, file)| (name, file)).collect()))
    }

    /// Returns once no unlink answered by this node is still under way.
    pub(crate) async fn settled(&self) {
        // Every request to the metadata server passes here: most find
        // nothing under way, and need no waiter.
        if self.state.lock().pending == 0 {
            return;
        }
        // Creates behind waiting for others to join go now.
        self.kick.notify_one();
        loop {
            let woken = self.done.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.state.lock().pending == 0 {
                return;
            }
            woken.await;
        }
    }

    /// Returns once fewer than [`MOST_PENDING`] unlinks are under way.
    async fn room(&self) {
        loop {
            let woken = self.done.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.state.lock().pending < MOST_PENDING {
                return;
            }
            woken.await;
        }
    }

    /// Makes `name` in held directory `dir` behind, with the next handle
    /// given for it, if this node holds `dir` with time to spare, knows
    /// every name in it and its policies, `name` is not one of them, no
    /// unlink behind is under way (it might be of the same name) and not
    /// too many files made behind are; queues the create. `Err(true)`:
    /// not made, for want of a handle; `Err(false)`: not made.
    pub(crate) fn make(
        &self,
        dir: u64,
        name: &[u8],
        mode: u32,
        owner: Option<(u32, u32)>,
        servers: u32,
    ) -> std::result::Result<Made, bool> {
        let mut s = self.state.lock();
        if s.pending > s.behind.len() || s.behind.len() >= MOST_BEHIND || servers == 0 {
            return Err(false);
        }
        let h = s.held.get(&dir).ok_or(false)?;
        if Instant::now() + SLACK >= h.until
            || h.names.contains_key(name)
            || h.dirs.contains(name)
            || h.settings.is_none()
        {
            return Err(false);
        }
        let owner = match (owner, &h.attr) {
            (Some(o), _) => o,
            (None, Some(a)) => (a.uid, a.gid),
            (None, None) => return Err(false),
        };
        let handle = s.handles.pop().ok_or(true)?;
        let first_server = (handle % servers as u64) as u32;
        let h = s.held.get_mut(&dir).expect("held, just seen");
        h.names.insert(name.to_vec(), handle);
        let parent = h.attr.as_mut().map(|a| {
            changed_here(a);
            a.clone()
        });
        let settings = h.settings.clone().expect("known, just seen");
        s.behind.insert(handle, dir);
        s.pending += 1;
        s.creates.push((
            dir,
            Behind {
                name: name.to_vec(),
                handle,
                mode: mode & 0o7777,
                uid: owner.0,
                gid: owner.1,
                first_server,
                size: 0,
            },
        ));
        let start = !std::mem::replace(&mut s.creating, true);
        Ok(Made {
            handle,
            first_server,
            parent,
            settings,
            owner,
            start,
        })
    }

    /// Handles the metadata server gave this node for creates behind.
    pub(crate) fn add_handles(&self, first: u64, count: u32) {
        let mut s = self.state.lock();
        s.handles.extend((first..first + count as u64).rev());
    }

    /// Whether `handle` is a file made behind that the metadata server has
    /// not answered yet.
    pub(crate) fn is_behind(&self, handle: u64) -> bool {
        self.state.lock().behind.contains_key(&handle)
    }

    /// Takes the create of `handle` out of the queue, not sent yet, to be
    /// sent now with the file's content (its close); its directory.
    pub(crate) fn take_create(&self, handle: u64) -> Option<(u64, Behind)> {
        let mut s = self.state.lock();
        let at = s.creates.iter().position(|(_, b)| b.handle == handle)?;
        Some(s.creates.remove(at))
    }

    /// Every create behind queued now, by directory in order, taken to be
    /// sent by a request that waits for them (the sender is not woken).
    fn take_creates(&self) -> Vec<(u64, Vec<Behind>)> {
        let mut s = self.state.lock();
        let mut out: Vec<(u64, Vec<Behind>)> = Vec::new();
        for (d, b) in std::mem::take(&mut s.creates) {
            match out.iter_mut().find(|(dir, _)| *dir == d) {
                Some((_, v)) => v.push(b),
                None => out.push((d, vec![b])),
            }
        }
        out
    }

    /// Whether as many creates are queued as one request takes.
    fn creates_full(&self) -> bool {
        self.state.lock().creates.len() >= CREATES_BATCH
    }

    /// The next creates behind to send together: the first queued one's
    /// directory and those queued in it, in order (`None`: nothing is
    /// queued, and the sender stops).
    fn next_creates(&self) -> Option<(u64, Vec<Behind>)> {
        let mut s = self.state.lock();
        let Some(&(dir, _)) = s.creates.first() else {
            s.creating = false;
            return None;
        };
        let mut same = Vec::new();
        let mut rest = Vec::new();
        for (d, b) in std::mem::take(&mut s.creates) {
            if d == dir && same.len() < CREATES_BATCH * 4 {
                same.push(b);
            } else {
                rest.push((d, b));
            }
        }
        s.creates = rest;
        Some((dir, same))
    }

    /// The metadata server answered the create behind of `handle` (`ok`:
    /// made): it is under way no more. A refused one leaves the directory
    /// not held (its names are not known for sure any more).
    fn created(&self, handle: u64, ok: bool) {
        let mut s = self.state.lock();
        if let Some(dir) = s.behind.remove(&handle) {
            if !ok {
                s.held.remove(&dir);
            }
            s.pending -= 1;
        }
        drop(s);
        self.done.notify_waiters();
    }

    /// Whether this node holds `dir` (or is asking for it): a callback of
    /// it is then a callback of the hold.
    fn involved(&self, dir: u64) -> bool {
        let s = self.state.lock();
        s.held.contains_key(&dir) || s.asking.contains_key(&dir)
    }

    /// The hold on `dir` was called back (or lost, with the server: every
    /// hold, `None`).
    fn recalled(&self, dir: Option<u64>) {
        let mut s = self.state.lock();
        let now = Instant::now();
        match dir {
            Some(d) => {
                s.held.remove(&d);
                s.recalled.insert(d, now);
            }
            None => {
                // The server may have restarted: the handles it gave are
                // gone with it.
                s.handles.clear();
                let mut all: Vec<u64> = s.held.drain().map(|(d, _)| d).collect();
                all.extend(s.asking.keys().copied());
                for d in all {
                    s.recalled.insert(d, now);
                }
            }
        }
    }

    /// This node's own request `req` to the metadata server was answered
    /// `resp` (`None`: it failed): the names of held directories follow it.
    pub(crate) fn note(&self, req: &Request, resp: Option<&Response>) {
        use Request::*;
        let mut s = self.state.lock();
        if s.held.is_empty() && s.asking.is_empty() {
            return;
        }
        // (directory, name removed from it), (directory, name added).
        let (from, to): (Option<Named>, Option<Named>) = match req {
            Create { parent, name, .. }
            | Mkdir { parent, name, .. }
            | Symlink { parent, name, .. }
            | Mknod { parent, name, .. } => (None, Some((*parent, name))),
            Link {
                new_parent, new_name, ..
            } => (None, Some((*new_parent, new_name))),
            Unlink { parent, name, .. } | Rmdir { parent, name } => (Some((*parent, name)), None),
            Rename {
                parent,
                name,
                new_parent,
                new_name,
            } => (Some((*parent, name)), Some((*new_parent, new_name))),
            SetAttr { handle, .. } => (None, Some((*handle, &b""[..]))),
            _ => return,
        };
        let done = resp.filter(|r| !matches!(r, Response::Error(_)));
        let Some(resp) = done else {
            // Refused or lost: what the directories hold is not known for
            // sure any more.
            for (dir, _) in from.iter().chain(to.iter()) {
                s.held.remove(dir);
                if let Some(n) = s.asking.get_mut(dir) {
                    n.lost = true;
                }
            }
            return;
        };
        let (added, parent_after) = match resp {
            Response::Created { attr, parent, .. } => (Some(attr), parent.clone()),
            Response::Unlinked { parent, .. } => (None, Some(parent.clone())),
            Response::Attr(a) => (Some(a), None),
            _ => (None, None),
        };
        let mut moved = 0;
        let mut moved_dir = false;
        if let Some((dir, name)) = from {
            if let Some(h) = s.held.get_mut(&dir) {
                moved = h.names.remove(name).unwrap_or(0);
                moved_dir = h.dirs.remove(name);
                h.attr = parent_after.clone();
            } else if let Some(n) = s.asking.get_mut(&dir) {
                n.names.push((name.to_vec(), None));
                n.attr = Some(parent_after.clone());
            }
        }
        if let Some((dir, name)) = to {
            let handle = match (req, added) {
                (Rename { .. }, _) if moved_dir => None,
                (Rename { .. }, _) => Some(moved),
                (_, Some(a)) if a.kind != FileKind::Dir => Some(a.handle),
                _ => None,
            };
            // A directory named here (a mkdir, a directory renamed here; a
            // rename from a directory not held may be one).
            let a_dir = !name.is_empty() && handle.is_none() && matches!(req, Mkdir { .. } | Rename { .. });
            // A directory (or a rename of one) is not unlinked.
            let named = handle.filter(|_| !name.is_empty());
            if let Some(h) = s.held.get_mut(&dir) {
                h.attr = match (parent_after, req) {
                    (Some(a), _) => Some(a),
                    // Their answers carry no parent: its attributes after
                    // are worked out here, as for an unlink answered here
                    // (`rm -rf` of what git made with links and mkdirs).
                    (None, Mkdir { .. } | Symlink { .. } | Link { .. } | Mknod { .. }) => h.attr.take().map(|mut a| {
                        changed_here(&mut a);
                        if matches!(req, Mkdir { .. }) {
                            a.nlink += 1;
                        }
                        a
                    }),
                    (None, _) => None,
                };
                match named {
                    Some(handle) => drop(h.names.insert(name.to_vec(), handle)),
                    None => drop(h.names.remove(name)),
                }
                if a_dir {
                    h.dirs.insert(name.to_vec());
                }
            } else if let Some(n) = s.asking.get_mut(&dir) {
                n.attr = Some(parent_after);
                if !name.is_empty() {
                    n.names.push((name.to_vec(), named));
                }
                // Whether the listing shows the new directory is not
                // known: the names are not known for sure.
                n.lost |= a_dir;
            }
        }
    }
}

impl Fs {
    /// Answers an unlink of `name` in `dir` before the metadata server has
    /// it, if this node holds `dir` (asking for it first if worth it),
    /// knows `name` there and its file is not open here (an open file's
    /// unlink keeps it, which needs the server's answer). `Ok(None)`: not done,
    /// make it the usual way. `Ok(Some(attr))`: done, with the directory's
    /// attributes after if known.
    pub async fn unlink_behind(&self, dir: u64, name: &[u8]) -> Result<Option<Option<Attr>>> {
        if !self.leasing() {
            return Ok(None);
        }
        self.holds.room().await;
        let open = |h: u64| if h == 0 { self.any_open() } else { self.is_open(h) };
        let mut taken = self.holds.take(dir, name, open);
        if taken.is_none() && self.holds.ask(dir) {
            let sent = Instant::now();
            let got = self.hold_dir(dir).await;
            self.holds.asked(dir, sent, got.ok());
            taken = self.holds.take(dir, name, open);
        }
        let Some((file, attr)) = taken else {
            if tracing::enabled!(tracing::Level::DEBUG) {
                let s = self.holds.state.lock();
                let h = s.held.get(&dir);
                tracing::debug!(
                    "unlink of '{}' not answered before the metadata server has it: {} under way, held {}, name known {:?}, hold left {:?}",
                    show_name(name),
                    s.pending,
                    h.is_some(),
                    h.map(|h| h.names.get(name)),
                    h.map(|h| h.until.saturating_duration_since(Instant::now()))
                );
            }
            return Ok(None);
        };
        let Some(fs) = self.me.upgrade() else {
            self.holds.finished();
            return Ok(None);
        };
        if self.holds.queue(dir, name.to_vec(), file) {
            tokio::spawn(fs.send_unlinks());
        }
        Ok(Some(attr))
    }

    /// Sends the unlinks answered here, as they queue up: those of one
    /// directory queued meanwhile go in one request (`Unlinks`: one
    /// round trip and one wake-up of the metadata server for many, as
    /// `rm -rf` and mdtest's remove phase make them), the next batch once
    /// the last is answered. A file gone with its last name has its data
    /// removed after.
    async fn send_unlinks(self: std::sync::Arc<Self>) {
        while let Some((dir, names)) = self.holds.next_batch() {
            // Only the file answered for: sent again after a lost
            // connection, the hold has ended and another node may have
            // made the name again.
            let req = Request::Unlinks {
                parent: dir,
                names: names
                    .iter()
                    .map(|(name, file)| (name.clone(), (*file != 0).then_some(*file)))
                    .collect(),
            };
            let before = self.mds.change_count();
            let sent = self.mds.call(&req, &[]).await;
            self.names_changed(&req, before);
            let answers = match sent {
                Ok((Response::Each(each), _)) if each.len() == names.len() => each.into_iter().map(Ok).collect(),
                Ok((other, _)) => vec![Err(format!("{other:?}")); names.len()],
                Err(e) => vec![Err(format!("lost: {e}")); names.len()],
            };
            let mut done = 0;
            for ((name, _), answer) in names.into_iter().zip(answers) {
                match answer {
                    Ok(Response::Unlinked { gone: Some(gone), .. }) => {
                        let fs = self.clone();
                        tokio::spawn(async move {
                            if let Err(e) = fs.remove_data(&gone).await {
                                tracing::warn!("removing the data of unlinked '{}': {e}", show_name(&name));
                            }
                            fs.holds.finished();
                        });
                        continue;
                    }
                    Ok(Response::Unlinked { gone: None, .. }) => {}
                    // Gone already (its creation was lost in a crash of the
                    // server, the last second before it, as documented), or
                    // another node made the name again after a lost
                    // connection ended the hold: nothing of this node's to
                    // remove.
                    Ok(Response::Error(e)) if e.code == parcache_proto::ErrorCode::NotFound => {
                        tracing::warn!(
                            "the unlink of '{}' answered before the metadata server had it removed nothing there: {} (made in the last second before a crash of the server, or again by another node after this one lost the server?)",
                            show_name(&name),
                            e.message
                        );
                    }
                    Ok(other) => tracing::error!(
                        "the unlink of '{}' answered before the metadata server had it failed there: {other:?}",
                        show_name(&name)
                    ),
                    Err(e) => tracing::error!(
                        "the unlink of '{}' answered before the metadata server had it failed there: {e}",
                        show_name(&name)
                    ),
                }
                done += 1;
            }
            self.holds.finished_n(done);
        }
    }

    /// Asks the metadata server for `dir` alone, then lists its names;
    /// the names and the directory's attributes.
    async fn hold_dir(&self, dir: u64) -> Result<Listing> {
        let what = format!("directory {}", self.what(dir));
        self.settled().await;
        // This node's changes of the directory answered from here on (by
        // other threads: the kernel lets creates and unlinks of other
        // names through) are noted and applied to the listing, which may
        // or may not show them; one answered later goes to the hold. (A
        // failed hold here used to be any change under way, and kept the
        // directory from being asked for again for 5 seconds.)
        let attr = self.md_attr(&what, Request::HoldDir { dir }).await?;
        let entries = self.list_entries(dir, MOST_NAMES).await?;
        let entries = entries.ok_or_else(|| FsError::Protocol(format!("{what}: too many names to hold")))?;
        let (subdirs, files): (Vec<_>, Vec<_>) = entries.into_iter().partition(|e| e.kind == FileKind::Dir);
        let names = files.into_iter().map(|e| (e.name, e.handle)).collect();
        let dirs = subdirs.into_iter().map(|e| e.name).collect();
        // What a file made here behind takes (a change of them calls the
        // hold back first).
        let settings = match self.md(&what, Request::GetPolicy { handle: dir }).await {
            Ok(Response::Policies(p)) if made_behind_under(&p) => Some(p),
            _ => None,
        };
        Ok((names, dirs, attr, settings))
    }

    /// Makes a file `name` in `dir` before the metadata server has it, if
    /// this node holds `dir` (asking for it first if worth it) and knows
    /// `name` is not there: a create behind (as CephFS's asynchronous
    /// creates, with handles the server gave this node ahead). The server
    /// gets it a moment later with others made meanwhile in one request,
    /// or with its content at its close ([`Fs::create_with_content`]);
    /// every other request of this node's to the server waits for it, and
    /// another node's that touches the directory calls this node back,
    /// answered only once the server has it: nobody sees the directory
    /// without it. `owner`: its owner and group (else the directory's).
    /// `Ok(None)`: not made, make it the usual way. `Ok(Some((file,
    /// directory after)))`: made.
    pub async fn create_behind(
        &self,
        dir: u64,
        name: &[u8],
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<Option<(Attr, Option<Attr>)>> {
        // A name the server would refuse goes the usual way, for its error.
        let valid = !name.is_empty()
            && name.len() <= parcache_proto::NAME_MAX
            && name != b"."
            && name != b".."
            && !name.contains(&b'/')
            && !name.contains(&0);
        if !self.leasing() || !valid {
            return Ok(None);
        }
        let servers = self.data.servers() as u32;
        let mut made = self.holds.make(dir, name, mode, owner, servers);
        if matches!(made, Err(false)) && self.holds.ask(dir) {
            let sent = Instant::now();
            let got = self.hold_dir(dir).await;
            self.holds.asked(dir, sent, got.ok());
            made = self.holds.make(dir, name, mode, owner, servers);
        }
        if matches!(made, Err(true)) {
            // For want of a handle: a batch of them, then once more.
            match self.mds.call(&Request::Handles { count: HANDLES_AT_ONCE }, &[]).await {
                Ok((Response::Reserved { first, count }, _)) => self.holds.add_handles(first, count),
                Ok((other, _)) => {
                    tracing::debug!("handles for creates behind: {other:?}");
                    return Ok(None);
                }
                Err(e) => {
                    tracing::debug!("handles for creates behind: {e}");
                    return Ok(None);
                }
            }
            made = self.holds.make(dir, name, mode, owner, servers);
        }
        let Ok(made) = made else {
            if tracing::enabled!(tracing::Level::DEBUG) {
                let s = self.holds.state.lock();
                let h = s.held.get(&dir);
                tracing::debug!(
                    "create of '{}' not made behind: {} under way, {} behind, held {}, settings known {:?}, handles {}",
                    show_name(name),
                    s.pending,
                    s.behind.len(),
                    h.is_some(),
                    h.map(|h| h.settings.is_some()),
                    s.handles.len()
                );
            }
            return Ok(None);
        };
        let t = parcache_proto::Timestamp::now();
        let (unit, width) = parcache_core::catalogue::stripe(&made.settings, servers);
        let attr = Attr {
            handle: made.handle,
            kind: FileKind::File,
            mode: mode & 0o7777,
            uid: made.owner.0,
            gid: made.owner.1,
            size: 0,
            nlink: 1,
            atime: t,
            mtime: t,
            ctime: t,
            version: parcache_proto::FIRST_VERSION,
            layout: Some(parcache_proto::Layout::round_robin(
                unit,
                width,
                servers,
                made.first_server,
            )),
            rdev: 0,
        };
        self.name(&attr, &show_name(name));
        let learnt = self.learn(&attr, &made.settings);
        self.data.created(attr.handle);
        if made.start {
            if let Some(fs) = self.me.upgrade() {
                tokio::spawn(fs.send_creates());
            }
        }
        learnt?;
        Ok(Some((attr, made.parent)))
    }

    /// Returns once nothing this node answered before the metadata server
    /// had it is still under way: the creates behind queued now are sent
    /// from here first (not by the sender, a wake-up less for the request
    /// that waits: a `chmod` right after a create, as `tar` makes them).
    pub(crate) async fn settled(&self) {
        if self.holds.state.lock().pending == 0 {
            return;
        }
        for (dir, files) in self.holds.take_creates() {
            let handles: Vec<u64> = files.iter().map(|f| f.handle).collect();
            let req = Request::CreatesBehind { parent: dir, files };
            self.made_behind(&req, &handles, &[], 0).await;
        }
        self.holds.settled().await;
    }

    /// Sends the creates behind as they queue up: those of one directory
    /// queued within [`CREATE_WAIT`] of each other (or until a request
    /// waits for them) go in one request, the next batch once the last is
    /// answered.
    async fn send_creates(self: std::sync::Arc<Self>) {
        loop {
            if !self.holds.creates_full() {
                tokio::select! {
                    _ = self.holds.kick.notified() => {}
                    _ = tokio::time::sleep(CREATE_WAIT) => {}
                }
            }
            let Some((dir, files)) = self.holds.next_creates() else {
                return;
            };
            let handles: Vec<u64> = files.iter().map(|f| f.handle).collect();
            let req = Request::CreatesBehind { parent: dir, files };
            self.made_behind(&req, &handles, &[], 0).await;
        }
    }

    /// Sends creates behind `req` (of the files `handles`; `content`
    /// their payload, `upto` the writes of the one file it carries the
    /// content of) and takes in the answers; the answer for each.
    pub(crate) async fn made_behind(
        &self,
        req: &Request,
        handles: &[u64],
        content: &[u8],
        upto: u64,
    ) -> Vec<Option<Attr>> {
        let before = self.mds.change_count();
        let sent = self.mds.call(req, content).await;
        self.names_changed(req, before);
        let answers: Vec<std::result::Result<Attr, String>> = match sent {
            Ok((Response::Each(each), _)) if each.len() == handles.len() => each
                .into_iter()
                .map(|r| match r {
                    Response::Created { attr, .. } => Ok(attr),
                    other => Err(format!("{other:?}")),
                })
                .collect(),
            Ok((other, _)) => vec![Err(format!("{other:?}")); handles.len()],
            Err(e) => vec![Err(format!("lost: {e}")); handles.len()],
        };
        let mut out = Vec::with_capacity(handles.len());
        for (&handle, answer) in handles.iter().zip(answers) {
            match answer {
                Ok(attr) => {
                    let upto = if content.is_empty() { 0 } else { upto };
                    self.with_file(handle, |_, f| f.made_behind(upto, view(&attr)));
                    self.changed_here(handle, before);
                    self.holds.created(handle, true);
                    out.push(Some(attr));
                }
                Err(why) => {
                    tracing::error!(
                        "{}, made before the metadata server had it, was not made there: {why}",
                        self.what(handle)
                    );
                    self.lost_behind(handle, &why);
                    self.holds.created(handle, false);
                    out.push(None);
                }
            }
        }
        out
    }

    /// The metadata server called back `handle`: if it is a directory
    /// this node holds, its unlinks under way are done first.
    pub(crate) async fn recall_hold(&self, handle: u64) {
        if self.holds.involved(handle) {
            self.holds.recalled(Some(handle));
            self.settled().await;
        }
    }

    /// The mount is going away (after [`Fs::shutdown`]): the metadata
    /// server drops this node's leases and holds at once (`Leave`), rather
    /// than calling back a node whose kernel keeps nothing any more and
    /// waiting for each until it runs out (a process that mounts again
    /// keeps its old connection open until it ends).
    pub async fn drop_leases(&self) -> Result<()> {
        if !self.leasing() {
            return Ok(());
        }
        self.holds_lost();
        self.md("leave", Request::Leave { node: self.node }).await?;
        Ok(())
    }

    /// The connection to the metadata server was lost: no hold is left.
    pub(crate) fn holds_lost(&self) {
        self.holds.recalled(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcache_proto::{Attr, Timestamp};

    fn attr(handle: u64, kind: FileKind) -> Attr {
        Attr {
            version: 1,
            ..Attr::empty(handle, kind)
        }
    }

    fn held(h: &DirHolds, dir: u64, names: &[(&str, u64)]) {
        let names = names.iter().map(|(n, h)| (n.as_bytes().to_vec(), *h)).collect();
        h.asked(
            dir,
            Instant::now(),
            Some((names, HashSet::new(), attr(dir, FileKind::Dir), Some(vec![]))),
        );
    }

    fn closed(_: u64) -> bool {
        false
    }

    /// A directory is asked for at its second unlink in a row, once at a
    /// time, and not again soon after a callback; a callback while it was
    /// being asked for leaves it not held.
    #[test]
    fn a_directory_is_asked_for_when_busy_and_dropped_when_called_back() {
        let h = DirHolds::default();
        assert!(!h.ask(1), "a first unlink alone");
        assert!(h.ask(1), "a second within a second");
        assert!(!h.ask(1), "being asked for");
        let sent = Instant::now();
        h.recalled(Some(1));
        h.asked(
            1,
            sent,
            Some((
                HashMap::from([(b"f".to_vec(), 5)]),
                HashSet::new(),
                attr(1, FileKind::Dir),
                None,
            )),
        );
        assert_eq!(h.take(1, b"f", closed), None, "called back while asked for");
        assert!(!h.ask(1), "called back lately");
        assert!(!h.ask(3) && h.ask(3));
        h.asked(3, Instant::now(), None);
        assert!(!h.ask(3), "refused (too many names) lately");
        held(&h, 2, &[("f", 5)]);
        assert!(!h.ask(2), "a first unlink there");
        assert!(!h.ask(2), "held already");
    }

    /// Only a name known in a held directory, whose file is not open
    /// here, is taken; each once; the directory's times move.
    #[test]
    fn only_known_names_of_files_not_open_are_taken() {
        let h = DirHolds::default();
        assert_eq!(h.take(1, b"f", closed), None, "not held");
        held(&h, 1, &[("f", 5), ("g", 6), ("unknown", 0)]);
        assert_eq!(h.take(1, b"g", |x| x == 6), None, "open here");
        assert_eq!(h.take(1, b"unknown", |x| x == 0), None, "maybe open (handle not known)");
        let (file, a) = h.take(1, b"f", closed).expect("taken");
        let a = a.expect("attributes known");
        assert_eq!(file, 5, "the name's file, which the unlink sent carries");
        assert_eq!(a.version, 2);
        assert!(a.mtime > Timestamp::default());
        assert_eq!(h.take(1, b"f", closed), None, "taken once");
        assert_eq!(h.take(1, b"nothing", closed), None);
        assert_eq!(h.state.lock().pending, 1);
        h.finished();
        h.recalled(None);
        assert_eq!(h.take(1, b"g", closed), None, "the server was lost");
    }

    /// A file is made behind only in a held directory whose names and
    /// policies are known, under a name none of its files or directories
    /// has, with a handle given ahead, and not while an unlink behind is
    /// under way; its name is known at once, its unlink waits for the
    /// server's answer, and creates go by directory, in order.
    #[test]
    fn a_file_is_made_behind_only_under_a_new_name_in_a_known_directory() {
        let h = DirHolds::default();
        let names = HashMap::from([(b"f".to_vec(), 5)]);
        let dirs = HashSet::from([b"sub".to_vec()]);
        h.asked(
            1,
            Instant::now(),
            Some((names, dirs, attr(1, FileKind::Dir), Some(vec![]))),
        );
        held(&h, 2, &[]);
        h.asked(
            3,
            Instant::now(),
            Some((HashMap::new(), HashSet::new(), attr(3, FileKind::Dir), None)),
        );
        let make = |dir, name: &str| h.make(dir, name.as_bytes(), 0o644, Some((7, 8)), 4).map(|m| m.handle);
        assert_eq!(make(1, "new").err(), Some(true), "no handle yet");
        h.add_handles(100, 3);
        assert_eq!(make(1, "f").err(), Some(false), "a file's name");
        assert_eq!(make(1, "sub").err(), Some(false), "a directory's name");
        assert_eq!(
            make(3, "new").err(),
            Some(false),
            "the directory's policies are not known"
        );
        assert_eq!(make(9, "new").err(), Some(false), "not held");
        let m = h.make(1, b"new", 0o100644, Some((7, 8)), 4).expect("made");
        assert_eq!((m.handle, m.owner), (100, (7, 8)), "the first handle given");
        assert!(m.start, "the first starts the sender");
        assert_eq!(m.parent.expect("the directory's attributes").version, 2);
        assert_eq!(make(1, "new").err(), Some(false), "made once");
        assert!(h.is_behind(100));
        assert_eq!(
            h.take(1, b"new", closed),
            None,
            "its unlink waits for the server's answer"
        );
        assert_eq!(make(2, "x"), Ok(101));
        assert_eq!(make(1, "other"), Ok(102));
        let (dir, batch) = h.next_creates().expect("queued");
        assert_eq!(dir, 1);
        let got: Vec<_> = batch
            .iter()
            .map(|b| (b.handle, b.mode, b.uid, b.gid, b.first_server))
            .collect();
        assert_eq!(got, vec![(100, 0o644, 7, 8, 0), (102, 0o644, 7, 8, 2)]);
        assert_eq!(h.next_creates().map(|(d, b)| (d, b.len())), Some((2, 1)));
        assert!(h.next_creates().is_none());
        assert_eq!(h.state.lock().pending, 3);
        for handle in [100, 101] {
            h.created(handle, true);
        }
        h.created(102, false);
        assert_eq!(h.state.lock().pending, 0);
        assert!(
            h.take(1, b"new", closed).is_none(),
            "a refused create leaves the directory not held"
        );
        assert!(h.take(2, b"x", closed).is_some(), "made: its unlink goes behind");
        h.add_handles(200, 1);
        assert_eq!(make(2, "y").err(), Some(false), "an unlink behind is under way");
        h.finished();
        assert_eq!(make(2, "y"), Ok(200));
        h.recalled(None);
        assert!(
            h.state.lock().handles.is_empty(),
            "the server was lost: its handles too"
        );
    }

    /// Unlinks answered here queue up while one batch is under way: the
    /// first queued starts the sender, the next batch is every name queued
    /// in the first one's directory, in order; the sender stops once
    /// nothing is queued, and the next unlink starts it again.
    #[test]
    fn unlinks_queue_up_and_go_by_directory_in_order() {
        let h = DirHolds::default();
        assert!(h.queue(1, b"a".to_vec(), 5), "the first starts the sender");
        assert!(!h.queue(2, b"x".to_vec(), 0), "one is sending");
        assert!(!h.queue(1, b"b".to_vec(), 6));
        assert!(!h.queue(1, b"c".to_vec(), 0));
        let names = |v: Vec<(Vec<u8>, u64)>| {
            v.into_iter()
                .map(|(n, f)| (String::from_utf8(n).unwrap(), f))
                .collect::<Vec<_>>()
        };
        let (dir, batch) = h.next_batch().expect("queued");
        assert_eq!(
            (dir, names(batch)),
            (1, vec![("a".into(), 5), ("b".into(), 6), ("c".into(), 0)])
        );
        assert!(!h.queue(1, b"d".to_vec(), 7), "still sending");
        let (dir, batch) = h.next_batch().expect("queued");
        assert_eq!((dir, names(batch)), (2, vec![("x".into(), 0)]));
        let (dir, batch) = h.next_batch().expect("queued");
        assert_eq!((dir, names(batch)), (1, vec![("d".into(), 7)]));
        assert_eq!(h.next_batch(), None);
        assert!(h.queue(3, b"e".to_vec(), 0), "the sender stopped: started again");
    }

    /// This node's own requests keep a held directory's names: a create
    /// adds its file, a rename moves the handle, a directory is not kept,
    /// a refused or lost request drops the hold.
    #[test]
    fn this_nodes_requests_keep_the_names() {
        let h = DirHolds::default();
        held(&h, 1, &[("f", 5)]);
        held(&h, 2, &[]);
        let created = Response::Created {
            attr: attr(7, FileKind::File),
            policies: vec![],
            parent: Some(attr(1, FileKind::Dir)),
        };
        let req = Request::Create {
            parent: 1,
            name: b"new".to_vec(),
            mode: 0o644,
            exclusive: true,
        };
        h.note(&req, Some(&created));
        let rename = Request::Rename {
            parent: 1,
            name: b"f".to_vec(),
            new_parent: 2,
            new_name: b"moved".to_vec(),
        };
        h.note(&rename, Some(&Response::Ok));
        let mkdir = Request::Mkdir {
            parent: 2,
            name: b"sub".to_vec(),
            mode: 0o755,
        };
        h.note(&mkdir, Some(&Response::Attr(attr(8, FileKind::Dir))));
        assert_eq!(h.take(1, b"f", closed), None, "renamed away");
        assert!(h.take(2, b"sub", closed).is_none(), "a directory");
        assert!(h.take(2, b"moved", |x| x == 5).is_none(), "the handle moved with it");
        assert!(h.take(1, b"new", closed).is_some());
        let unlink = Request::Unlink {
            parent: 2,
            name: b"x".to_vec(),
            keep_open: false,
            only: None,
        };
        h.note(&unlink, None);
        assert!(h.take(2, b"moved", closed).is_none(), "lost: not held any more");
    }

    /// A mkdir, link or symlink in a held directory, whose answers carry
    /// no parent, leaves its attributes known, worked out here: an unlink
    /// answered here after it still gives the kernel the directory's
    /// attributes (`rm -rf` of what git made). A rename's answer leaves
    /// them unknown.
    #[test]
    fn a_mkdir_or_link_keeps_a_held_directorys_attributes() {
        let h = DirHolds::default();
        held(&h, 2, &[("f", 5), ("g", 6)]);
        let before = attr(2, FileKind::Dir);
        let mkdir = Request::Mkdir {
            parent: 2,
            name: b"sub".to_vec(),
            mode: 0o755,
        };
        h.note(&mkdir, Some(&Response::Attr(attr(8, FileKind::Dir))));
        let link = Request::Link {
            handle: 5,
            new_parent: 2,
            new_name: b"linked".to_vec(),
        };
        h.note(&link, Some(&Response::Attr(attr(5, FileKind::File))));
        let (_, after) = h.take(2, b"f", closed).expect("held");
        let after = after.expect("the directory's attributes, worked out here");
        assert_eq!(
            (after.nlink, after.version),
            (before.nlink + 1, before.version + 3),
            "a link more (the new directory's ..), a version for each change"
        );
        let rename = Request::Rename {
            parent: 2,
            name: b"linked".to_vec(),
            new_parent: 2,
            new_name: b"moved".to_vec(),
        };
        h.note(&rename, Some(&Response::Ok));
        let (_, after) = h.take(2, b"g", closed).expect("held");
        assert!(after.is_none(), "a rename's answer gives no attributes");
    }

    fn create(h: &DirHolds, dir: u64, name: &str, handle: u64) {
        let req = Request::Create {
            parent: dir,
            name: name.as_bytes().to_vec(),
            mode: 0o644,
            exclusive: false,
        };
        let created = Response::Created {
            attr: attr(handle, FileKind::File),
            policies: vec![],
            parent: Some(attr(dir, FileKind::Dir)),
        };
        h.note(&req, Some(&created));
    }

    /// This node's changes answered while a directory is asked for are
    /// applied to its listing (which may or may not show them); a failed
    /// one leaves it not held. (Two threads creating or unlinking in one
    /// directory used to keep it from being held at all.)
    #[test]
    fn changes_made_while_asking_are_applied_to_the_listing() {
        let h = DirHolds::default();
        assert!(!h.ask(1) && h.ask(1));
        let sent = Instant::now();
        create(&h, 1, "new", 7);
        create(&h, 1, "listed", 8);
        let unlink = Request::Unlink {
            parent: 1,
            name: b"gone".to_vec(),
            keep_open: false,
            only: None,
        };
        let after = Attr {
            version: 9,
            ..attr(1, FileKind::Dir)
        };
        let unlinked = Response::Unlinked {
            parent: after,
            gone: None,
        };
        h.note(&unlink, Some(&unlinked));
        // The listing shows some of them (made before it) and not others.
        let listed = HashMap::from([(b"listed".to_vec(), 8), (b"gone".to_vec(), 6), (b"old".to_vec(), 5)]);
        h.asked(1, sent, Some((listed, HashSet::new(), attr(1, FileKind::Dir), None)));
        assert_eq!(h.take(1, b"gone", closed), None, "unlinked meanwhile");
        let (file, a) = h.take(1, b"new", closed).expect("made meanwhile");
        let a = a.expect("attributes");
        assert_eq!(file, 7);
        assert_eq!(a.version, 10, "the directory's attributes after the last change noted");
        assert!(h.take(1, b"listed", closed).is_some());
        assert!(h.take(1, b"old", closed).is_some());

        assert!(!h.ask(2) && h.ask(2));
        let sent = Instant::now();
        h.note(
            &Request::Create {
                parent: 2,
                name: b"x".to_vec(),
                mode: 0o644,
                exclusive: true,
            },
            None,
        );
        h.asked(
            2,
            sent,
            Some((HashMap::new(), HashSet::new(), attr(2, FileKind::Dir), None)),
        );
        assert_eq!(h.take(2, b"x", closed), None, "a change lost meanwhile: not held");
        assert!(!h.ask(2), "nor asked for again soon");
    }
}
