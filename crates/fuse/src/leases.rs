//! The kernel's side of the metadata server's leases
//! (`parcache_core::consistency::leases`): a file's attributes, and the
//! name it was reached by, are given to the kernel to keep for what is
//! left of the lease, and taken back (`FUSE_NOTIFY_INVAL_ENTRY`, then
//! `_INODE`) when the server calls the lease back, before this node
//! answers. A `stat` then costs no request until another node changes the
//! file, and still sees that change once it is answered.
//!
//! Two races are closed here. An answer on its way while the lease is
//! called back would put the old attributes back after the callback: each
//! request takes a [`Ticket`] first, and an answer whose ticket is older
//! than the last callback is given to the kernel with no time to live. And
//! a name is noted before its answer reaches the kernel, so a callback
//! that comes after finds it (the kernel's own lookup holds the directory,
//! which the invalidation of the name waits for).

use fuser::Notifier;
use parcache_client::{Attr, EntryPlus, FileKind, Fs};
use parcache_core::consistency::leases::LEASE;
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Names noted per file (hard links); a file reached by more is given to
/// the kernel under the names it has with no time to live.
const MAX_NAMES: usize = 16;

/// Kept off the lease's end: the kernel starts its clock when it reads
/// the answer, a little after this node worked out what is left.
const MARGIN: Duration = Duration::from_millis(50);

/// What the kernel keeps under leases, and how to take it back.
#[derive(Default)]
pub(crate) struct KernelLeases {
    held: Mutex<Held>,
    /// Held (shared) by each answer from working out its time to live
    /// until it is written to the kernel; a callback takes it alone once
    /// before invalidating, so no answer worked out before the callback
    /// reaches the kernel after its invalidation.
    replying: RwLock<()>,
    /// Set once the mount is up.
    pub(crate) notifier: OnceLock<Notifier>,
}

/// A name in a directory: the directory's inode and the name.
type Named = (u64, Vec<u8>);

#[derive(Default)]
struct Held {
    /// Callbacks (and losses of the server) so far.
    forgotten: u64,
    /// The names each file was given to the kernel by, and when last: kept
    /// for as long as the kernel may keep one (a lease), not dropped at
    /// the kernel's `FORGET` ([`KernelLeases::dropped`]).
    names: HashMap<u64, GivenNames>,
    /// Lookups' answers kept for the open that usually follows
    /// ([`KernelLeases::take_looked`]).
    looked: HashMap<u64, Looked>,
    /// Setattrs' answers kept for the kernel's getattr of the same file
    /// that follows ([`KernelLeases::take_set`]).
    set: HashMap<u64, Looked>,
    /// Directories whose names this node knows under a lease on them
    /// (`WatchDir`): a name not among them is absent.
    dirs: HashMap<u64, KnownNames>,
    /// Directories being listed after their `WatchDir`: the names this
    /// node added to each meanwhile.
    watching: HashMap<u64, HashSet<Vec<u8>>>,
    /// Names this node is adding (its request in flight), per directory.
    adding: HashMap<u64, HashMap<Vec<u8>, u32>>,
    /// When each directory was last watched: not again within half a lease.
    tried: HashMap<u64, Instant>,
    /// Lookups' answers got ahead of them (`ReadDirPlus`), per directory
    /// and name, and the content bytes they hold.
    ahead: HashMap<u64, HashMap<Vec<u8>, Ahead>>,
    ahead_kept: usize,
    ahead_bytes: usize,
    /// Files this node looked up at the server lately, per directory: how
    /// many, since when.
    finding: HashMap<u64, (u32, Instant)>,
    /// Directories whose files are being fetched ahead.
    ahead_dirs: HashMap<u64, AheadDir>,
}

/// How far a directory's files were fetched ahead.
struct AheadDir {
    /// Where the next page starts (`None`: at the start).
    after: Option<Vec<u8>>,
    /// Pages the next fetch asks for (doubling up to [`AHEAD_PAGES_MOST`]).
    pages: u32,
    fetching: bool,
    /// When the directory's end was reached (or a fetch failed).
    ended: Option<Instant>,
}

impl Held {
    /// Room for a fetch ahead in `dir`: the answers got ahead that no
    /// lookup may take any more (a callback since, or their lease run
    /// out) go, then those of other directories. Those of `dir` not taken
    /// yet stay: the program reading it has not come to them.
    fn make_room_ahead(&mut self, dir: u64) {
        let forgotten = self.forgotten;
        let lease = Duration::from_nanos(LEASE.0);
        let usable =
            |a: &Ahead| a.looked.ticket.forgotten == forgotten && a.looked.ticket.at.elapsed() + MARGIN < lease;
        for names in self.ahead.values_mut() {
            names.retain(|_, a| usable(a));
        }
        let kept = |h: &Held| h.ahead.values().map(HashMap::len).sum::<usize>();
        if kept(self) > MAX_AHEAD / 2 {
            self.ahead.retain(|d, _| *d == dir);
        }
        self.ahead.retain(|_, names| !names.is_empty());
        self.ahead_kept = kept(self);
        self.ahead_bytes = self
            .ahead
            .values()
            .flat_map(|names| names.values())
            .map(|a| a.content.as_ref().map_or(0, Vec::len))
            .sum();
    }
}

/// A lookup's answer got ahead of it, with a small file's content.
struct Ahead {
    looked: Looked,
    content: Option<Vec<u8>>,
}

/// The names a file was given to the kernel by.
#[derive(Default)]
struct GivenNames {
    names: Vec<Named>,
    /// When the last of them was given.
    at: Option<Instant>,
}

/// Files whose names are noted, past which those whose last name was
/// given more than a lease ago (the kernel keeps none of them) go.
const MAX_NAMED: usize = 16_384;

/// A directory's names as this node knows them, and until when.
struct KnownNames {
    names: HashSet<Vec<u8>>,
    until: Instant,
}

/// Directories whose names are kept at most; more start the table again.
const MAX_DIRS: usize = 64;
/// Names a directory may have for this node to keep them (its listing is
/// fetched at each lease).
pub(crate) const WATCH_MOST: usize = 16_384;
/// Names kept of one directory at most, with those this node added: past
/// it, its lookups ask the server again.
const MAX_KNOWN: usize = 65_536;

/// Most lookups' answers kept for opens; more (a walk that opens
/// nothing) start the table again.
const MAX_LOOKED: usize = 4096;

/// Files found by lookups at the server in one directory within
/// [`AHEAD_WITHIN`] after which the rest of its files are fetched ahead.
const AHEAD_AFTER: u32 = 4;
const AHEAD_WITHIN: Duration = Duration::from_secs(1);
/// Answers got ahead kept at most (past it, no more pages are fetched
/// until lookups take some), and their small files' content bytes (past
/// it, answers are kept without their content).
const MAX_AHEAD: usize = 16_384;
const MAX_AHEAD_BYTES: usize = 64 << 20;
/// Files in a page of `ReadDirPlus`, about (room made for before a fetch).
const AHEAD_PAGE_GUESS: usize = 256;
/// Pages one fetch ahead asks for at most: the first asks for one, each
/// next (at the next [`AHEAD_AFTER`] lookups the pages so far did not
/// answer) twice as many, as a read-ahead window grows; a program that
/// looks up a few files of a large directory fetches one page.
const AHEAD_PAGES_MOST: u32 = 16;

/// A lookup's answer and what was true when it was asked.
struct Looked {
    attr: Attr,
    policies: Vec<(String, String)>,
    ticket: Ticket,
    /// This node's metadata changes sent before it (none was in flight).
    changes: u64,
}

impl Looked {
    /// Whether an answer `attr` to a request of ticket `t`, sent with this
    /// node's metadata changes at `changes` (sent, ended), is worth keeping:
    /// a file's, under a lease, with no change of this node's in flight.
    fn keeps(t: Ticket, changes: (u64, u64), attr: &Attr) -> bool {
        t.leased && changes.0 == changes.1 && attr.kind == FileKind::File
    }

    /// Whether the metadata server would still answer the same: no lease
    /// of this node was called back since the ticket (`forgotten`, the
    /// callbacks so far), the lease runs, and this node's changes are
    /// still the count kept (`changes_now`).
    fn fresh(&self, forgotten: u64, changes_now: (u64, u64)) -> bool {
        self.ticket.forgotten == forgotten
            && self.ticket.at.elapsed() + MARGIN < Duration::from_nanos(LEASE.0)
            && changes_now.0 == self.changes
    }
}

/// Taken before a request whose answer the kernel may keep.
#[derive(Clone, Copy)]
pub(crate) struct Ticket {
    forgotten: u64,
    at: Instant,
    leased: bool,
}

impl KernelLeases {
    /// A ticket for a request about to go to the metadata server.
    pub(crate) fn ticket(&self, fs: &Fs) -> Ticket {
        Ticket {
            forgotten: self.held.lock().forgotten,
            at: Instant::now(),
            leased: fs.leasing(),
        }
    }

    /// Sends an answer with `a` (`send`, given its time to live as
    /// [`KernelLeases::ttl`] works it out) before any callback that comes
    /// after the time to live was worked out invalidates the kernel's copy.
    pub(crate) fn reply_with<R>(
        &self,
        t: Ticket,
        a: &Attr,
        name: Option<(u64, &[u8])>,
        dir_ttl: Duration,
        send: impl FnOnce(&Duration) -> R,
    ) -> R {
        let _answering = self.replying.read();
        send(&self.ttl(t, a, name, dir_ttl))
    }

    /// How long the kernel may keep `a`, answered to the request of
    /// ticket `t`, reached as `name` in a directory (for an entry):
    /// what is left of the lease; none if a callback came after the
    /// ticket (or there is no lease). Directories keep `dir_ttl`.
    fn ttl(&self, t: Ticket, a: &Attr, name: Option<(u64, &[u8])>, dir_ttl: Duration) -> Duration {
        if a.kind == FileKind::Dir {
            return dir_ttl;
        }
        if !t.leased {
            return Duration::ZERO;
        }
        let left = Duration::from_nanos(LEASE.0).saturating_sub(t.at.elapsed() + MARGIN);
        let mut held = self.held.lock();
        let stale = held.forgotten != t.forgotten;
        let lease = Duration::from_nanos(LEASE.0);
        let kept = |g: &GivenNames| g.at.is_some_and(|at| at.elapsed() < lease);
        if held.names.len() >= MAX_NAMED && !held.names.contains_key(&a.handle) {
            held.names.retain(|_, g| kept(g));
        }
        let given = held.names.entry(a.handle).or_default();
        if !kept(given) {
            // The kernel keeps none of them any more.
            given.names.clear();
        }
        if let Some((dir, name)) = name {
            if !given.names.iter().any(|(d, n)| *d == dir && n == name) {
                if given.names.len() >= MAX_NAMES {
                    return Duration::ZERO;
                }
                given.names.push((dir, name.to_vec()));
            }
            given.at = Some(Instant::now());
        }
        if stale {
            Duration::ZERO
        } else {
            left
        }
    }

    /// Keeps a lookup's answer for the open after it: `t` and `changes`
    /// (this node's metadata changes, sent and ended) taken before the
    /// lookup was sent. Kept only if no change of this node's was in
    /// flight then, so the answer reflects every change it made.
    pub(crate) fn looked(&self, t: Ticket, changes: (u64, u64), attr: &Attr, policies: Vec<(String, String)>) {
        if !Looked::keeps(t, changes, attr) {
            return;
        }
        let mut held = self.held.lock();
        if held.looked.len() >= MAX_LOOKED {
            held.looked.clear();
        }
        held.looked.insert(
            attr.handle,
            Looked {
                attr: attr.clone(),
                policies,
                ticket: t,
                changes: changes.0,
            },
        );
    }

    /// The answer of the last lookup of `handle`, if an open may take it
    /// for a `getattr` at the open (close-to-open): its lease still runs
    /// and nothing may have changed the file since, as no lease of this
    /// node was called back (another node's change is answered only
    /// after the callback) and this node sent no change (`changes_now`,
    /// as [`KernelLeases::looked`] took it). Taken: one open per lookup.
    pub(crate) fn take_looked(&self, handle: u64, changes_now: (u64, u64)) -> Option<(Attr, Vec<(String, String)>)> {
        let mut held = self.held.lock();
        let l = held.looked.remove(&handle)?;
        l.fresh(held.forgotten, changes_now).then_some((l.attr, l.policies))
    }

    /// Keeps a setattr's answer `attr` for the kernel's getattr of the
    /// file that follows: a `chown` makes the kernel ask for the file's
    /// attributes again (it clears set-user-ID bits itself), right after
    /// `tar x`, `cp -a` or `rsync` set the file's times. `t` and `before`
    /// (this node's metadata changes, sent and ended) were taken before
    /// the setattr was sent: kept only if no change was in flight then, so
    /// the answer reflects every change this node made.
    pub(crate) fn set(&self, t: Ticket, before: (u64, u64), attr: &Attr) {
        if !Looked::keeps(t, before, attr) {
            return;
        }
        let mut held = self.held.lock();
        if held.set.len() >= MAX_LOOKED {
            held.set.clear();
        }
        let kept = Looked {
            attr: attr.clone(),
            policies: Vec::new(),
            ticket: t,
            // The setattr itself is the one change allowed since.
            changes: before.0 + 1,
        };
        held.set.insert(attr.handle, kept);
    }

    /// The answer of the last setattr of `handle`, with its ticket, while
    /// the metadata server would answer a getattr with the same: the lease
    /// runs, no lease of this node was called back (another node's change
    /// is answered only after the callback) and this node sent no change
    /// after the setattr (`changes_now`, as [`KernelLeases::set`] counts).
    pub(crate) fn take_set(&self, handle: u64, changes_now: (u64, u64)) -> Option<(Attr, Ticket)> {
        let mut held = self.held.lock();
        let l = held.set.get(&handle)?;
        if l.fresh(held.forgotten, changes_now) {
            Some((l.attr.clone(), l.ticket))
        } else {
            held.set.remove(&handle);
            None
        }
    }

    /// The metadata server called back the lease on `handle` (`None`: the
    /// connection to it was lost, every lease goes): the kernel forgets
    /// the file's names, then its attributes. Blocks until it has.
    pub(crate) fn forget(&self, handle: Option<u64>) {
        let gone: Vec<(u64, Vec<Named>)> = {
            let mut held = self.held.lock();
            held.forgotten += 1;
            match handle {
                Some(h) => {
                    held.looked.remove(&h);
                    held.set.remove(&h);
                    held.dirs.remove(&h);
                    vec![(h, held.names.remove(&h).unwrap_or_default().names)]
                }
                None => {
                    held.looked.clear();
                    held.set.clear();
                    held.dirs.clear();
                    held.ahead.clear();
                    held.ahead_kept = 0;
                    held.ahead_bytes = 0;
                    held.names.drain().map(|(h, g)| (h, g.names)).collect()
                }
            }
        };
        // Answers whose time to live was worked out before the count
        // moved reach the kernel first (those after give none). Not held
        // while invalidating: the kernel's invalidation of a name waits
        // for a lookup in its directory, which may wait for an answer.
        drop(self.replying.write());
        let Some(n) = self.notifier.get() else {
            return;
        };
        for (ino, names) in gone {
            for (dir, name) in names {
                // Not known to the kernel any more: nothing to forget.
                let _ = n.inval_entry(dir, OsStr::from_bytes(&name));
            }
            let _ = n.inval_inode(ino, -1, 0);
        }
    }

    /// Whether `name` is absent from directory `dir`: this node holds a
    /// lease on the directory's names and knows every one (a create's
    /// lookup is then answered without a request).
    pub(crate) fn absent(&self, dir: u64, name: &[u8]) -> bool {
        let held = self.held.lock();
        held.dirs
            .get(&dir)
            .is_some_and(|k| Instant::now() < k.until && !k.names.contains(name))
    }

    /// This node removed `name` from `dir` (an unlink, rmdir or rename
    /// away answered): under a lease on the directory's names, a lookup
    /// of it is answered absent from now on, as the server would answer
    /// (its own unlink reaches the server before any later request of
    /// this node's). SQLite looks for its journal right after removing it.
    pub(crate) fn removed(&self, dir: u64, name: &[u8]) {
        let mut held = self.held.lock();
        if held.adding.get(&dir).is_some_and(|a| a.contains_key(name)) {
            // Being made again at the same time: it may exist.
            return;
        }
        if let Some(k) = held.dirs.get_mut(&dir) {
            k.names.remove(name);
        }
    }

    /// This node is about to add `name` to `dir` (create, mkdir, mknod,
    /// symlink, link, rename): from now on the name may exist. The guard
    /// marks the request ended when dropped.
    pub(crate) fn adding(self: &Arc<Self>, dir: u64, name: &[u8]) -> Adding {
        let mut held = self.held.lock();
        if let Some(k) = held.dirs.get_mut(&dir) {
            k.names.insert(name.to_vec());
            if k.names.len() > MAX_KNOWN {
                held.dirs.remove(&dir);
            }
        }
        if let Some(w) = held.watching.get_mut(&dir) {
            w.insert(name.to_vec());
        }
        *held.adding.entry(dir).or_default().entry(name.to_vec()).or_default() += 1;
        Adding {
            leases: self.clone(),
            dir,
            name: name.to_vec(),
        }
    }

    /// A lookup at the server found a file in `dir`: whether to fetch more
    /// of the directory's files ahead now, and from where and how many
    /// pages (at the [`AHEAD_AFTER`]th such lookup there within
    /// [`AHEAD_WITHIN`], none being fetched, the directory's end not
    /// reached within half a lease; `leasing`: the node holds leases at
    /// all). A program reading or `stat`ing many files of a directory then
    /// finds their answers here. End the fetch with
    /// [`KernelLeases::fetched_ahead`].
    pub(crate) fn found_at_server(&self, dir: u64, leasing: bool) -> Option<(Option<Vec<u8>>, u32)> {
        if !leasing {
            return None;
        }
        let mut held = self.held.lock();
        let now = Instant::now();
        if held.finding.len() >= MAX_DIRS {
            held.finding.clear();
        }
        let f = held.finding.entry(dir).or_insert((0, now));
        if now.duration_since(f.1) > AHEAD_WITHIN {
            *f = (0, now);
        }
        f.0 += 1;
        if f.0 < AHEAD_AFTER {
            return None;
        }
        held.finding.remove(&dir);
        if held.ahead_dirs.len() >= MAX_DIRS && !held.ahead_dirs.contains_key(&dir) {
            held.ahead_dirs.retain(|_, d| d.fetching);
        }
        let d = held.ahead_dirs.entry(dir).or_insert(AheadDir {
            after: None,
            pages: 1,
            fetching: false,
            ended: None,
        });
        if d.fetching {
            return None;
        }
        if let Some(t) = d.ended {
            if now.duration_since(t) < Duration::from_nanos(LEASE.0 / 2) {
                return None;
            }
            // What was fetched then has run out with its leases.
            (d.after, d.pages, d.ended) = (None, 1, None);
        }
        d.fetching = true;
        let (after, pages) = (d.after.clone(), d.pages);
        d.pages = (d.pages * 2).min(AHEAD_PAGES_MOST);
        if held.ahead_kept + AHEAD_PAGE_GUESS * pages as usize > MAX_AHEAD || held.ahead_bytes > MAX_AHEAD_BYTES / 2 {
            held.make_room_ahead(dir);
        }
        Some((after, pages))
    }

    /// A fetch ahead of `dir`'s files ended: the next starts after `after`;
    /// `ended`: the directory's end was reached (or the fetch failed).
    pub(crate) fn fetched_ahead(&self, dir: u64, after: Option<Vec<u8>>, ended: bool) {
        let mut held = self.held.lock();
        if let Some(d) = held.ahead_dirs.get_mut(&dir) {
            d.fetching = false;
            d.after = after;
            if ended {
                d.ended = Some(Instant::now());
            }
        }
    }

    /// Keeps a page of `dir`'s files got ahead (`ReadDirPlus`), `t` and
    /// `changes` taken before it was asked for, as
    /// [`KernelLeases::looked`] keeps a lookup's answer: `None` if not
    /// kept (stale already), else whether room is left for the next page.
    pub(crate) fn got_ahead(&self, dir: u64, t: Ticket, changes: (u64, u64), page: Vec<EntryPlus>) -> Option<bool> {
        let mut held = self.held.lock();
        if held.forgotten != t.forgotten || page.iter().any(|e| !Looked::keeps(t, changes, &e.attr)) {
            return None;
        }
        for e in page {
            // Past the content's room, the attributes alone (the open
            // then reads the bytes from the data servers).
            let content = e.content.filter(|c| held.ahead_bytes + c.len() <= MAX_AHEAD_BYTES);
            let bytes = content.as_ref().map_or(0, Vec::len);
            let looked = Looked {
                attr: e.attr,
                policies: e.policies,
                ticket: t,
                changes: changes.0,
            };
            let ahead = Ahead { looked, content };
            if let Some(old) = held.ahead.entry(dir).or_default().insert(e.name, ahead) {
                held.ahead_kept -= 1;
                held.ahead_bytes -= old.content.map_or(0, |c| c.len());
            }
            held.ahead_kept += 1;
            held.ahead_bytes += bytes;
        }
        Some(held.ahead_kept < MAX_AHEAD)
    }

    /// The answer got ahead for the lookup of `name` in `dir`, if the
    /// metadata server would still answer the same (as
    /// [`KernelLeases::take_looked`] decides: the lease runs, no lease of
    /// this node was called back, this node sent no change since): the
    /// attributes, policies, a small file's content, and the ticket and
    /// changes it was asked for with. Taken: one lookup each.
    #[allow(clippy::type_complexity)]
    pub(crate) fn take_ahead(
        &self,
        dir: u64,
        name: &[u8],
        changes_now: (u64, u64),
    ) -> Option<(Attr, Vec<(String, String)>, Option<Vec<u8>>, Ticket, (u64, u64))> {
        let mut held = self.held.lock();
        let a = held.ahead.get_mut(&dir)?.remove(name)?;
        held.ahead_kept -= 1;
        held.ahead_bytes -= a.content.as_ref().map_or(0, Vec::len);
        if !a.looked.fresh(held.forgotten, changes_now) {
            // Every answer got ahead before the same callback or change
            // is as stale.
            held.ahead.clear();
            held.ahead_kept = 0;
            held.ahead_bytes = 0;
            return None;
        }
        let l = a.looked;
        Some((l.attr, l.policies, a.content, l.ticket, (l.changes, l.changes)))
    }

    /// Starts watching `dir`'s names (a lookup there found nothing) unless
    /// they are known, being listed, or were tried within half a lease:
    /// the ticket to learn them with ([`KernelLeases::learn_names`]).
    /// `leasing`: the node holds leases at all.
    pub(crate) fn start_watch(&self, dir: u64, leasing: bool) -> Option<Ticket> {
        if !leasing {
            return None;
        }
        let mut held = self.held.lock();
        let now = Instant::now();
        let known = held.dirs.get(&dir).is_some_and(|k| now < k.until);
        let recent = held
            .tried
            .get(&dir)
            .is_some_and(|&t| now.duration_since(t) < Duration::from_nanos(LEASE.0 / 2));
        if known || recent || held.watching.contains_key(&dir) {
            return None;
        }
        if held.tried.len() >= MAX_DIRS {
            held.tried.clear();
        }
        held.tried.insert(dir, now);
        held.watching.insert(dir, HashSet::new());
        Some(Ticket {
            forgotten: held.forgotten,
            at: now,
            leased: true,
        })
    }

    /// The listing of `dir` after its `WatchDir` (`None`: it failed or
    /// the directory is too big). Kept only if no lease of this node was
    /// called back since the ticket; with every name this node added
    /// meanwhile or is adding (a request the server may answer after the
    /// listing).
    pub(crate) fn learn_names(&self, dir: u64, t: Ticket, listing: Option<Vec<Vec<u8>>>) {
        let mut held = self.held.lock();
        let added = held.watching.remove(&dir).unwrap_or_default();
        let Some(listing) = listing else {
            return;
        };
        if held.forgotten != t.forgotten {
            return;
        }
        let mut names: HashSet<Vec<u8>> = listing.into_iter().collect();
        names.extend(added);
        if let Some(a) = held.adding.get(&dir) {
            names.extend(a.keys().cloned());
        }
        if held.dirs.len() >= MAX_DIRS {
            held.dirs.clear();
        }
        let until = t.at + Duration::from_nanos(LEASE.0).saturating_sub(MARGIN);
        held.dirs.insert(dir, KnownNames { names, until });
    }

    /// The kernel dropped the inode (`FORGET`). Its names stay noted: over
    /// FUSE's io_uring queues the `FORGET` comes on another thread than
    /// the lookups, and may be read after a lookup that gave the kernel
    /// the inode again; dropping its names then left that name with the
    /// kernel past the next callback (`stat` on one node of a name
    /// another had renamed a file over answered `ENOENT`: the kernel
    /// asked the attributes of the file replaced). A name the kernel no
    /// longer knows costs a callback one needless invalidation.
    pub(crate) fn dropped(&self, ino: u64) {
        let mut held = self.held.lock();
        held.looked.remove(&ino);
        held.set.remove(&ino);
    }
}

/// A name this node is adding to a directory; dropped when the request
/// ended (answered or failed).
pub(crate) struct Adding {
    leases: Arc<KernelLeases>,
    dir: u64,
    name: Vec<u8>,
}

impl Drop for Adding {
    fn drop(&mut self) {
        let mut held = self.leases.held.lock();
        if let Some(w) = held.watching.get_mut(&self.dir) {
            w.insert(self.name.clone());
        }
        if let Some(a) = held.adding.get_mut(&self.dir) {
            if let Some(n) = a.get_mut(&self.name) {
                *n -= 1;
                if *n == 0 {
                    a.remove(&self.name);
                }
            }
            if a.is_empty() {
                held.adding.remove(&self.dir);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(handle: u64, kind: FileKind) -> Attr {
        Attr::empty(handle, kind)
    }

    fn ticket(l: &KernelLeases) -> Ticket {
        Ticket {
            forgotten: l.held.lock().forgotten,
            at: Instant::now(),
            leased: true,
        }
    }

    #[test]
    fn an_answer_crossing_a_callback_is_not_kept() {
        let l = KernelLeases::default();
        let t = ticket(&l);
        let ttl = l.ttl(t, &attr(5, FileKind::File), Some((1, b"f")), Duration::from_secs(1));
        assert!(ttl > Duration::from_secs(9), "{ttl:?}");
        let t = ticket(&l);
        l.forget(Some(5));
        assert_eq!(
            l.ttl(t, &attr(5, FileKind::File), Some((1, b"f")), Duration::ZERO),
            Duration::ZERO
        );
        assert_eq!(
            l.held.lock().names[&5].names,
            vec![(1, b"f".to_vec())],
            "noted for the next callback"
        );
        l.dropped(5);
        assert_eq!(
            l.held.lock().names[&5].names,
            vec![(1, b"f".to_vec())],
            "a FORGET read late may be of an inode the kernel has again: still noted"
        );
        l.forget(None);
        assert!(l.held.lock().names.is_empty());
    }

    /// Files are fetched ahead at the fourth lookup found at the server in
    /// a directory within a second, one fetch at a time, each going on
    /// from the last with twice its pages, none within half a lease of the
    /// directory's end; an
    /// answer got ahead is taken once, and only while the server would
    /// answer the same: a callback of any lease, or a change this node
    /// sent, and every answer got ahead is stale.
    #[test]
    fn answers_got_ahead_are_taken_once_and_only_while_fresh() {
        let l = KernelLeases::default();
        let found = || (0..4).map(|_| l.found_at_server(1, true)).collect::<Vec<_>>();
        assert_eq!(found(), [None, None, None, Some((None, 1))], "the fourth: a page");
        assert_eq!(found(), [None, None, None, None], "one fetch at a time");
        l.fetched_ahead(1, Some(b"b".to_vec()), false);
        assert_eq!(
            found(),
            [None, None, None, Some((Some(b"b".to_vec()), 2))],
            "then twice as many, on"
        );
        l.fetched_ahead(1, Some(b"x".to_vec()), true);
        assert_eq!(found(), [None, None, None, None], "the end reached lately");
        assert_eq!(l.found_at_server(2, false), None, "no leases, no fetch");
        let entry = |name: &str, h: u64| EntryPlus {
            name: name.as_bytes().to_vec(),
            attr: attr(h, FileKind::File),
            policies: vec![("prefetch".into(), "none".into())],
            content: Some(vec![h as u8; 10]),
        };
        let page = || vec![entry("a", 5), entry("b", 6), entry("c", 7)];
        assert_eq!(l.got_ahead(1, ticket(&l), (3, 3), page()), Some(true));
        let (a, policies, content, _, changes) = l.take_ahead(1, b"a", (3, 3)).expect("got ahead");
        assert_eq!(
            (a.handle, policies.len(), content, changes),
            (5, 1, Some(vec![5; 10]), (3, 3))
        );
        assert!(l.take_ahead(1, b"a", (3, 3)).is_none(), "taken once");
        assert!(l.take_ahead(2, b"b", (3, 3)).is_none(), "another directory");
        assert!(l.take_ahead(1, b"b", (4, 4)).is_none(), "a change of this node's since");
        assert!(l.take_ahead(1, b"c", (3, 3)).is_none(), "all stale after one");
        assert_eq!(
            l.got_ahead(1, ticket(&l), (3, 4), page()),
            None,
            "a change in flight: not kept"
        );
        assert!(l.take_ahead(1, b"a", (4, 4)).is_none());
        let t = ticket(&l);
        l.forget(Some(99));
        assert_eq!(
            l.got_ahead(1, t, (4, 4), page()),
            None,
            "a callback while it was fetched"
        );
        assert_eq!(l.got_ahead(1, ticket(&l), (4, 4), page()), Some(true));
        l.forget(Some(99));
        assert!(l.take_ahead(1, b"b", (4, 4)).is_none(), "a callback after");
        assert_eq!(l.held.lock().ahead_kept, 0);
    }

    /// Room for answers got ahead: past the content's room an answer is
    /// kept without its content; making room for a directory drops the
    /// answers no lookup may take, then other directories' answers, and
    /// keeps that directory's.
    #[test]
    fn answers_got_ahead_make_room_without_dropping_the_reader_s() {
        let l = KernelLeases::default();
        let e = |name: String, h: u64, len: usize| EntryPlus {
            name: name.into_bytes(),
            attr: attr(h, FileKind::File),
            policies: vec![],
            content: Some(vec![1; len]),
        };
        let big: Vec<_> = (0..5).map(|i| e(format!("b{i}"), i, 16 << 20)).collect();
        assert_eq!(l.got_ahead(1, ticket(&l), (0, 0), big), Some(true));
        let kept: Vec<bool> = (0..5)
            .map(|i| l.take_ahead(1, format!("b{i}").as_bytes(), (0, 0)).unwrap().2.is_some())
            .collect();
        assert_eq!(kept, [true, true, true, true, false], "64 MiB of content at most");
        let many: Vec<_> = (0..9000).map(|i| e(format!("f{i}"), 100 + i, 0)).collect();
        assert_eq!(l.got_ahead(1, ticket(&l), (0, 0), many), Some(true));
        assert_eq!(
            l.got_ahead(2, ticket(&l), (0, 0), vec![e("g".into(), 5, 0)]),
            Some(true)
        );
        l.held.lock().make_room_ahead(1);
        assert_eq!(l.held.lock().ahead_kept, 9000, "the reader's directory's answers stay");
        assert!(l.take_ahead(2, b"g", (0, 0)).is_none(), "another directory's went");
        assert!(l.take_ahead(1, b"f8999", (0, 0)).is_some());
        l.held.lock().forgotten += 1;
        l.held.lock().make_room_ahead(1);
        assert_eq!(l.held.lock().ahead_kept, 0, "stale after a callback");
    }

    /// A directory's names are known from its listing, with every name
    /// this node added or is adding around it (a request the server may
    /// answer after the listing); a callback during the listing, or of the
    /// directory after, leaves them unknown (every lookup asks).
    #[test]
    fn a_directorys_names_include_this_nodes_adds_around_the_listing() {
        let l = Arc::new(KernelLeases::default());
        assert!(!l.absent(1, b"x"), "unknown directory");
        // In flight before the watch, answered after the listing.
        let early = l.adding(1, b"early");
        let t = l.start_watch(1, true).unwrap();
        assert!(l.start_watch(1, true).is_none(), "watched twice");
        // Sent after the watch began: answered before and after the listing.
        drop(l.adding(1, b"during"));
        let late = l.adding(1, b"late");
        l.learn_names(1, t, Some(vec![b"listed".to_vec()]));
        drop(early);
        for name in [&b"listed"[..], b"early", b"during", b"late"] {
            assert!(!l.absent(1, name), "{}", String::from_utf8_lossy(name));
        }
        assert!(l.absent(1, b"other"));
        drop(late);
        drop(l.adding(1, b"after"));
        assert!(!l.absent(1, b"after"));
        l.forget(Some(1));
        assert!(!l.absent(1, b"other"), "called back");

        // A callback (of any file) during the listing: not kept.
        let t = l.start_watch(2, true).unwrap();
        l.forget(Some(99));
        l.learn_names(2, t, Some(vec![]));
        assert!(!l.absent(2, b"other"));
        assert!(l.start_watch(2, true).is_none(), "tried again at once");
        assert!(l.start_watch(3, false).is_none(), "a node without leases");
        let t = l.start_watch(4, true).unwrap();
        l.learn_names(4, t, None);
        assert!(!l.absent(4, b"other"), "a directory too big");
    }

    /// An open takes a lookup's answer only while nothing may have
    /// changed the file since: no callback, no change of this node's sent
    /// or in flight, the lease running; and only once.
    #[test]
    fn an_open_takes_a_lookup_only_while_nothing_changed() {
        let l = KernelLeases::default();
        let a = attr(5, FileKind::File);
        let p = || vec![("write".to_string(), "write-back".to_string())];
        l.looked(ticket(&l), (3, 3), &a, p());
        assert_eq!(l.take_looked(5, (3, 3)), Some((a.clone(), p())));
        assert_eq!(l.take_looked(5, (3, 3)), None, "one open per lookup");
        // This node sent a change after the lookup (ended or not).
        l.looked(ticket(&l), (3, 3), &a, p());
        assert_eq!(l.take_looked(5, (4, 4)), None);
        // A change was in flight when the lookup was sent.
        l.looked(ticket(&l), (4, 3), &a, p());
        assert_eq!(l.take_looked(5, (4, 4)), None);
        // A callback (of any file) after the lookup was sent.
        let t = ticket(&l);
        l.looked(t, (4, 4), &a, p());
        l.forget(Some(9));
        assert_eq!(l.take_looked(5, (4, 4)), None);
        // A callback crossing the lookup: taken before it, noted after.
        let t = ticket(&l);
        l.forget(Some(5));
        l.looked(t, (4, 4), &a, p());
        assert_eq!(l.take_looked(5, (4, 4)), None);
        // The lease ran out.
        let old = Ticket {
            at: Instant::now() - Duration::from_nanos(LEASE.0),
            ..ticket(&l)
        };
        l.looked(old, (4, 4), &a, p());
        assert_eq!(l.take_looked(5, (4, 4)), None);
        // No lease, or not a file.
        l.looked(
            Ticket {
                leased: false,
                ..ticket(&l)
            },
            (4, 4),
            &a,
            p(),
        );
        assert_eq!(l.take_looked(5, (4, 4)), None);
        l.looked(ticket(&l), (4, 4), &attr(6, FileKind::Dir), p());
        assert_eq!(l.take_looked(6, (4, 4)), None);
        // The kernel dropped the inode; the server's connection was lost.
        l.looked(ticket(&l), (4, 4), &a, p());
        l.dropped(5);
        assert_eq!(l.take_looked(5, (4, 4)), None);
        l.looked(ticket(&l), (4, 4), &a, p());
        l.forget(None);
        assert_eq!(l.take_looked(5, (4, 4)), None);
        l.looked(ticket(&l), (4, 4), &a, p());
        assert!(l.take_looked(5, (4, 4)).is_some(), "and fresh again after all that");
    }

    /// The kernel's getattr takes a setattr's answer while the server
    /// would answer the same: the setattr was this node's only change
    /// since it was sent and none was in flight then, no callback came
    /// since its ticket, the lease runs; and as often as it is asked.
    #[test]
    fn a_getattr_takes_a_setattr_only_while_nothing_changed() {
        let l = KernelLeases::default();
        let a = attr(5, FileKind::File);
        let got = |l: &KernelLeases, changes| l.take_set(5, changes).map(|(a, _)| a);
        l.set(ticket(&l), (3, 3), &a);
        assert_eq!(got(&l, (4, 4)), Some(a.clone()), "the setattr itself is change 4");
        assert_eq!(got(&l, (4, 4)), Some(a.clone()), "kept for the next getattr too");
        assert_eq!(got(&l, (5, 4)), None, "another change sent since");
        assert_eq!(got(&l, (4, 4)), None, "and forgotten");
        // A change was in flight when the setattr was sent.
        l.set(ticket(&l), (4, 3), &a);
        assert_eq!(got(&l, (5, 5)), None);
        // A callback (of any file) crossing the setattr.
        let t = ticket(&l);
        l.forget(Some(9));
        l.set(t, (3, 3), &a);
        assert_eq!(got(&l, (4, 4)), None);
        // A callback of the file after it.
        l.set(ticket(&l), (3, 3), &a);
        l.forget(Some(5));
        assert_eq!(got(&l, (4, 4)), None);
        // The lease ran out; no lease; not a file.
        let old = Ticket {
            at: Instant::now() - Duration::from_nanos(LEASE.0),
            ..ticket(&l)
        };
        l.set(old, (3, 3), &a);
        assert_eq!(got(&l, (4, 4)), None);
        l.set(
            Ticket {
                leased: false,
                ..ticket(&l)
            },
            (3, 3),
            &a,
        );
        assert_eq!(got(&l, (4, 4)), None);
        l.set(ticket(&l), (3, 3), &attr(6, FileKind::Dir));
        assert_eq!(l.take_set(6, (4, 4)).map(|(a, _)| a), None);
        // The kernel dropped the inode; the connection was lost.
        l.set(ticket(&l), (3, 3), &a);
        l.dropped(5);
        assert_eq!(got(&l, (4, 4)), None);
        l.set(ticket(&l), (3, 3), &a);
        l.forget(None);
        assert_eq!(got(&l, (4, 4)), None);
        l.set(ticket(&l), (3, 3), &a);
        assert!(got(&l, (4, 4)).is_some(), "and fresh again after all that");
    }

    /// A callback's invalidation comes after every answer whose time to
    /// live was worked out before it: otherwise the kernel would keep the
    /// old attributes it invalidated, for the whole lease.
    #[test]
    fn a_callback_waits_for_answers_worked_out_before_it() {
        use std::sync::mpsc::channel;
        let l = Arc::new(KernelLeases::default());
        let (sending, being_sent) = channel();
        let (go, gone) = channel::<()>();
        let l2 = l.clone();
        let answer = std::thread::spawn(move || {
            l2.reply_with(
                ticket(&l2),
                &attr(5, FileKind::File),
                Some((1, b"f")),
                Duration::ZERO,
                |ttl| {
                    sending.send(*ttl).unwrap();
                    gone.recv().unwrap();
                },
            )
        });
        assert!(!being_sent.recv().unwrap().is_zero(), "an answer under a lease");
        let (l3, (done, ended)) = (l.clone(), channel());
        let callback = std::thread::spawn(move || {
            l3.forget(Some(5));
            done.send(()).unwrap();
        });
        assert!(
            ended.recv_timeout(Duration::from_millis(300)).is_err(),
            "the callback went ahead of an answer worked out before it"
        );
        go.send(()).unwrap();
        ended
            .recv_timeout(Duration::from_secs(10))
            .expect("the callback ends once the answer is sent");
        answer.join().unwrap();
        callback.join().unwrap();
        let after = l.reply_with(ticket(&l), &attr(5, FileKind::File), None, Duration::ZERO, |ttl| *ttl);
        assert!(!after.is_zero(), "a new answer after the callback is leased again");
    }

    #[test]
    fn directories_keep_their_own_time_and_unleased_answers_none() {
        let l = KernelLeases::default();
        let t = ticket(&l);
        let one = Duration::from_secs(1);
        assert_eq!(l.ttl(t, &attr(2, FileKind::Dir), None, one), one);
        let unleased = Ticket { leased: false, ..t };
        assert_eq!(l.ttl(unleased, &attr(5, FileKind::File), None, one), Duration::ZERO);
    }

    #[test]
    fn a_file_with_too_many_names_is_not_kept_under_a_new_one() {
        let l = KernelLeases::default();
        let a = attr(5, FileKind::File);
        for i in 0..MAX_NAMES {
            assert!(!l
                .ttl(ticket(&l), &a, Some((1, format!("n{i}").as_bytes())), Duration::ZERO)
                .is_zero());
        }
        assert!(l.ttl(ticket(&l), &a, Some((1, b"one more")), Duration::ZERO).is_zero());
        assert!(!l.ttl(ticket(&l), &a, Some((1, b"n0")), Duration::ZERO).is_zero());
        l.forget(Some(5));
        assert!(l.held.lock().names.is_empty());
        assert!(!l.ttl(ticket(&l), &a, Some((1, b"one more")), Duration::ZERO).is_zero());
    }
}
