//! A server this node talks to, reconnected when its connection is lost
//! (the server restarted, or the network dropped): the metadata server and
//! each data server. A restarted server is found again at its address and
//! the cluster secret proved anew; the loss and the recovery are logged.

use crate::{FsError, Result};
use bytes::Bytes;
use parcache_proto::{Client, ConnError, ErrorCode, Landing, Payload, Request, Response, Secret};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// How often to try a server that went away: six tries, 250 ms apart and
/// growing, about four seconds in all.
pub const DEFAULT_RETRIES: u32 = 6;
const RETRY_PAUSE: Duration = Duration::from_millis(250);

pub struct Peer {
    /// What the logs call it ("metadata server", "data server 2").
    name: String,
    addr: String,
    secret: Secret,
    conn: Mutex<Option<Client>>,
    retries: AtomicU32,
    /// Whether the loss was logged and the recovery is still to be.
    lost: AtomicBool,
    /// The node every request is made for (`Request::As`; 0: none).
    node: AtomicU64,
    /// Called (on a blocking thread) when a connection is found lost.
    on_lost: std::sync::OnceLock<Arc<dyn Fn() + Send + Sync>>,
    /// Called (in the runtime, without blocking) when a connection is made
    /// again after one was lost.
    on_found: std::sync::OnceLock<Arc<dyn Fn() + Send + Sync>>,
    /// Requests that may change the metadata server's answers: sent, and
    /// answered (or failed) ([`Peer::changes`]).
    changes_sent: AtomicU64,
    changes_done: AtomicU64,
    /// The count of changes sent that this client's last sync of the
    /// server covers ([`Peer::sync_due`]).
    synced: AtomicU64,
    /// This client's id for requests made at most once (`Request::Once`;
    /// 0: sent as they are), and the last sequence number given.
    once: AtomicU64,
    seq: AtomicU64,
    /// Changes a lost connection may have lost, as windows of their counts
    /// (after the last sync that covered changes before the loss, up to
    /// the last one sent): a server that restarted after a crash kept only
    /// what a sync made durable ([`Peer::may_have_lost`]).
    unsure: parking_lot::Mutex<Vec<Unsure>>,
    /// The changes sent and not yet ended, by their count: a sync covers
    /// every change before the first of them ([`Peer::sync_mark`]).
    in_flight: parking_lot::Mutex<BTreeSet<u64>>,
    /// The server's incarnation as this client last learned it, asked at
    /// each connection (0: not known; [`Peer::judge_loss`]).
    incarnation: AtomicU64,
}

/// Windows of changes a lost connection may have lost, kept apart at most
/// (more are merged into one wider window: only more checks follow).
const UNSURE_WINDOWS: usize = 16;

/// Changes a lost connection may have lost: their counts after `from` up
/// to `upto`; `settled`: the server was asked since whether it lost them
/// ([`Peer::settle`]).
#[derive(Clone, Copy, Debug)]
struct Unsure {
    from: u64,
    upto: u64,
    settled: bool,
}

/// What a sync about to be sent covers: every change this client sent
/// before it (their count), if all were answered ([`Peer::sync_due`]).
#[derive(Clone, Copy, Debug)]
pub struct SyncDue(Option<u64>);

impl SyncDue {
    /// The count of changes a sync sent with it covers once answered.
    pub fn covered(&self) -> Option<u64> {
        self.0
    }
}

/// Counts a request that may change what the server answers as done when
/// it ends; one abandoned in flight is never counted done (the server may
/// still apply it), so [`Peer::changes`] never shows a quiet peer again,
/// and it stays in flight ([`Peer::sync_mark`] covers only changes before it).
struct ChangeDone<'a> {
    done: &'a AtomicU64,
    in_flight: &'a parking_lot::Mutex<BTreeSet<u64>>,
    id: u64,
    ended: bool,
}

impl Drop for ChangeDone<'_> {
    fn drop(&mut self) {
        if self.ended {
            self.in_flight.lock().remove(&self.id);
            self.done.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Peer {
    pub fn new(name: String, addr: String, secret: Secret) -> Peer {
        Peer {
            name,
            addr,
            secret,
            conn: Mutex::new(None),
            retries: AtomicU32::new(DEFAULT_RETRIES),
            lost: AtomicBool::new(false),
            node: AtomicU64::new(0),
            on_lost: std::sync::OnceLock::new(),
            on_found: std::sync::OnceLock::new(),
            changes_sent: AtomicU64::new(0),
            changes_done: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            once: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            unsure: parking_lot::Mutex::new(Vec::new()),
            in_flight: parking_lot::Mutex::new(BTreeSet::new()),
            incarnation: AtomicU64::new(0),
        }
    }

    /// The server's incarnation learned on a connection made outside
    /// ([`Peer::connected`]).
    pub fn knows_incarnation(&self, now: u64) {
        self.incarnation.store(now, Ordering::SeqCst);
    }

    /// The count of changes this client's syncs of the server cover: each
    /// change counted up to it is durable there.
    pub fn synced_count(&self) -> u64 {
        self.synced.load(Ordering::SeqCst)
    }

    /// The count of changes sent so far: taken before and after a change
    /// is made, the two bound it for [`Peer::may_have_lost`].
    pub fn change_count(&self) -> u64 {
        self.changes_sent.load(Ordering::SeqCst)
    }

    /// Whether a change sent while the count of changes went from `before`
    /// to `after` may have been lost: a connection was lost after it was
    /// sent and before a sync covered it (the server may have crashed
    /// with it). A program's `fsync` then checks what the server has.
    pub fn may_have_lost(&self, (before, after): (u64, u64)) -> bool {
        self.unsure.lock().iter().any(|w| before < w.upto && after > w.from)
    }

    /// Whether a loss was noted since the server was last asked about
    /// losses ([`Peer::settle`]).
    pub fn unsettled(&self) -> bool {
        self.unsure.lock().iter().any(|w| !w.settled)
    }

    /// The server was asked about the losses noted since it was last
    /// asked ([`Peer::judge_loss`]): if it says it lost nothing
    /// since, and one loss was noted, that loss's changes are sure again
    /// (after more than one, which incarnation lost what is not known:
    /// they stay unsure).
    pub fn settle(&self, lost_nothing: bool) {
        let mut u = self.unsure.lock();
        if lost_nothing && u.iter().filter(|w| !w.settled).count() == 1 {
            u.retain(|w| w.settled);
        }
        for w in u.iter_mut() {
            w.settled = true;
        }
    }

    /// A connection was found lost: the changes sent since the last sync
    /// that covered its changes are unsure.
    fn note_loss(&self) {
        let (sent, synced) = (
            self.changes_sent.load(Ordering::SeqCst),
            self.synced.load(Ordering::SeqCst),
        );
        if sent <= synced {
            return;
        }
        let mut u = self.unsure.lock();
        u.push(Unsure {
            from: synced,
            upto: sent,
            settled: false,
        });
        if u.len() > UNSURE_WINDOWS {
            // Merged, never taken back.
            let from = u.iter().map(|w| w.from).min().unwrap_or(0);
            *u = vec![Unsure {
                from,
                upto: sent,
                settled: true,
            }];
        }
    }

    /// Makes every later request that is not idempotent one the server
    /// does at most once (`Request::Once`, which the metadata server
    /// knows; [`Request::wants_once`]), so that it too is sent again after
    /// a lost connection.
    pub fn exactly_once(&self) {
        self.once.store(parcache_proto::random_u64() | 1, Ordering::SeqCst);
    }

    /// Calls `f` (on a blocking thread) each time the connection is found
    /// lost, before connecting anew: what the server granted on it (a
    /// mount's leases) may be forgotten by a restarted server.
    pub fn on_lost(&self, f: Arc<dyn Fn() + Send + Sync>) {
        let _ = self.on_lost.set(f);
    }

    /// Calls `f` each time a connection is made again after one was lost
    /// (the server may have restarted and forgotten what it kept in
    /// memory). `f` must not block: it runs in the runtime, with the
    /// connection not yet handed out.
    pub fn on_found(&self, f: Arc<dyn Fn() + Send + Sync>) {
        let _ = self.on_found.set(f);
    }

    /// Makes every later request one made for `node`, a mount holding
    /// leases (the metadata server's `Request::As`).
    pub fn speak_for(&self, node: u64) {
        self.node.store(node, Ordering::SeqCst);
    }

    /// A peer whose first connection is already made.
    pub fn connected(name: String, client: Client, secret: Secret) -> Peer {
        let p = Peer::new(name, client.addr().to_string(), secret);
        *p.conn.try_lock().expect("new") = Some(client);
        p
    }

    pub fn set_retries(&self, n: u32) {
        self.retries.store(n.max(1), Ordering::Relaxed);
    }

    /// The live connection, connecting anew if there is none.
    async fn client(&self) -> std::result::Result<Client, ConnError> {
        let mut g = self.conn.lock().await;
        if let Some(c) = g.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        if g.is_some() {
            self.note_loss();
            if let Some(f) = self.on_lost.get().cloned() {
                tokio::task::spawn_blocking(move || f());
            }
            if !self.lost.swap(true, Ordering::SeqCst) {
                tracing::warn!("lost the connection to the {} ({}); reconnecting", self.name, self.addr);
            }
        }
        *g = None;
        let c = Client::connect(&self.addr, &self.secret).await?;
        self.judge_loss(&c).await?;
        if self.lost.swap(false, Ordering::SeqCst) {
            tracing::info!("reconnected to the {} ({})", self.name, self.addr);
            if let Some(f) = self.on_found.get() {
                f();
            }
        }
        *g = Some(c.clone());
        Ok(c)
    }

    /// Asks a new connection's server its incarnation, before anything
    /// else is sent on it, and judges the loss noted before it, if any
    /// ([`Peer::settle`]): nothing was lost if it is the incarnation this
    /// client knew (the network dropped, the server stayed) or the next
    /// one, whose predecessor lost nothing it acknowledged (a graceful
    /// stop; a data server's crash with the machine up). Judged here, at
    /// each reconnection, each loss is weighed against the incarnation
    /// just before it. A server that does not answer leaves it unsure.
    async fn judge_loss(&self, c: &Client) -> std::result::Result<(), ConnError> {
        let (resp, _) = c.call(&Request::Incarnation, &[]).await?;
        let Response::Incarnation {
            now,
            after_graceful_stop_of,
        } = resp
        else {
            return Ok(());
        };
        let known = self.incarnation.swap(now, Ordering::SeqCst);
        if self.unsettled() {
            let kept = known != 0 && (now == known || after_graceful_stop_of == Some(known));
            if !kept {
                tracing::warn!(
                    "the {} ({}) restarted after a crash (incarnation {known} → {now}): what this node sent it since its last sync may be lost; fsyncs of what it touched say EIO",
                    self.name,
                    self.addr
                );
            }
            self.settle(kept);
        }
        Ok(())
    }

    /// Sends a request, reconnecting (a bounded number of times) if the
    /// server went away. A request that may have reached the server before
    /// the connection broke is sent again only if doing it twice is
    /// harmless ([`Request::is_idempotent`]); otherwise the loss is the
    /// caller's error.
    pub async fn call(&self, req: &Request, data: &[u8]) -> Result<(Response, Bytes)> {
        self.call_with(req, Payload::Slice(data)).await
    }

    /// [`Peer::call`] with a payload borrowed or shared ([`Payload`]).
    pub async fn call_with(&self, req: &Request, data: Payload<'_>) -> Result<(Response, Bytes)> {
        if req.changes_nothing() {
            return self.send(req, data, None).await;
        }
        let id = {
            let mut f = self.in_flight.lock();
            let id = self.changes_sent.fetch_add(1, Ordering::SeqCst) + 1;
            f.insert(id);
            id
        };
        let mut done = ChangeDone {
            done: &self.changes_done,
            in_flight: &self.in_flight,
            id,
            ended: false,
        };
        let r = self.send(req, data, None).await;
        done.ended = true;
        r
    }

    /// Requests sent so far that may change what the server answers, and
    /// those of them that have ended. Equal: none is in flight, so an
    /// answer to a request sent after reflects every change this client
    /// made; a later first count equal to it: none was sent since.
    pub fn changes(&self) -> (u64, u64) {
        let sent = self.changes_sent.load(Ordering::SeqCst);
        (sent, self.changes_done.load(Ordering::SeqCst))
    }

    /// Whether a sync of the server (`Request::Sync`) has anything of this
    /// client's to make durable: a change was sent since the last sync
    /// that covered every change before it, or one is in flight. `None`:
    /// nothing. Once a sync sent after this returns, [`Peer::synced`]
    /// takes what this gave.
    pub fn sync_due(&self) -> Option<SyncDue> {
        let (sent, done) = self.changes();
        if sent == done && self.synced.load(Ordering::SeqCst) >= sent {
            return None;
        }
        Some(self.sync_mark())
    }

    /// What a sync sent now would cover, due or not: every change before
    /// the first one still in flight (which may reach the server after
    /// the sync), all of them if none is. (Covering nothing while any was
    /// in flight, a busy node's syncs never covered its changes.)
    pub fn sync_mark(&self) -> SyncDue {
        let f = self.in_flight.lock();
        let sent = self.changes_sent.load(Ordering::SeqCst);
        SyncDue(Some(f.first().map_or(sent, |&first| first - 1)))
    }

    /// A change made durably (done, then a sync, before its answer:
    /// `Request::Durably`), sent after [`Peer::sync_mark`] gave `mark`,
    /// returned: it covers the changes before it, and itself if no other
    /// was sent meanwhile.
    pub fn synced_with_own(&self, mark: SyncDue) {
        let Some(before) = mark.0 else {
            return;
        };
        let covered = match self.changes() {
            (sent, done) if sent == before + 1 && done == sent => sent,
            _ => before,
        };
        self.synced.fetch_max(covered, Ordering::SeqCst);
    }

    /// A sync of the server sent after [`Peer::sync_due`] gave `due`
    /// returned: every change answered before it is durable there.
    pub fn synced(&self, due: SyncDue) {
        if let Some(covered) = due.0 {
            self.synced.fetch_max(covered, Ordering::SeqCst);
        }
    }

    /// A read (a request that changes nothing, without a payload) whose
    /// answer's payload lands in the buffers `landing` lends where it fits
    /// ([`Client::call_landing`]); sent again on a new connection as
    /// [`Peer::call`] is.
    pub async fn call_landing(&self, req: &Request, landing: &Landing) -> Result<(Response, Bytes)> {
        debug_assert!(req.changes_nothing());
        self.send(req, Payload::Slice(&[]), Some(landing)).await
    }

    async fn send(&self, req: &Request, data: Payload<'_>, landing: Option<&Landing>) -> Result<(Response, Bytes)> {
        let once = match self.once.load(Ordering::SeqCst) {
            client if client != 0 && req.wants_once() => Some((client, self.seq.fetch_add(1, Ordering::SeqCst) + 1)),
            _ => None,
        };
        // Made at most once: sent again marked as a repeat (the server
        // looks for its kept answer only then).
        let made = |repeat: bool| {
            let req = match once {
                Some((client, seq)) => Request::Once {
                    client,
                    seq,
                    repeat,
                    req: Box::new(req.clone()),
                },
                None => req.clone(),
            };
            match self.node.load(Ordering::SeqCst) {
                0 => req,
                node => Request::As {
                    node,
                    req: Box::new(req),
                },
            }
        };
        let first = made(false);
        let again = once.map(|_| made(true));
        let retries = self.retries.load(Ordering::Relaxed);
        let mut last = String::new();
        for attempt in 0..retries {
            if attempt > 0 {
                tokio::time::sleep(RETRY_PAUSE * attempt).await;
            }
            let conn = match self.client().await {
                Ok(c) => c,
                Err(e @ ConnError::Auth { .. }) => return Err(e.into()),
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let req = match &again {
                Some(again) if attempt > 0 => again,
                _ => &first,
            };
            let answer = match landing {
                Some(l) => conn.call_landing(req, l).await,
                None => conn.call_with(req, data).await,
            };
            match answer {
                // Not done: the server is stopping (a restart, say).
                Ok((Response::Error(e), _)) if e.code == ErrorCode::Stopping => {
                    tracing::warn!("{} ({}): {}; retrying", self.name, self.addr, e.message);
                    last = e.message;
                }
                Ok(r) => return Ok(r),
                Err(e @ ConnError::TooLarge(_)) => return Err(e.into()),
                Err(e) if !req.is_idempotent() => return Err(e.into()),
                Err(e) => {
                    tracing::warn!("{} ({}): {e}; retrying", self.name, self.addr);
                    last = e.to_string();
                }
            }
        }
        Err(FsError::ServerDown {
            server: self.name.clone(),
            addr: self.addr.clone(),
            tries: retries,
            reason: last,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parcache_proto::{serve, Handler};
    use tokio::sync::Semaphore;

    /// A lost connection makes unsure exactly the changes sent after the
    /// last sync that covered changes; a change the sync covered, or one
    /// sent after the loss, is not. The server saying it lost nothing
    /// takes one loss back, never two.
    #[test]
    fn a_loss_makes_unsure_the_changes_no_sync_covered() {
        let p = Peer::new("test".into(), "127.0.0.1:1".into(), Secret::from_bytes([1; 32]));
        p.changes_sent.store(5, Ordering::SeqCst);
        p.synced.store(3, Ordering::SeqCst);
        p.note_loss();
        assert!(!p.may_have_lost((2, 3)), "synced");
        assert!(p.may_have_lost((3, 4)) && p.may_have_lost((4, 5)));
        assert!(p.may_have_lost((2, 9)), "a window around the loss");
        assert!(!p.may_have_lost((5, 6)), "sent after the loss");
        // Nothing unsynced: a loss makes nothing unsure.
        p.synced.store(9, Ordering::SeqCst);
        p.changes_sent.store(9, Ordering::SeqCst);
        p.note_loss();
        assert!(!p.may_have_lost((6, 9)));
        // Many losses merge into one window that covers them all.
        for i in 0..40u64 {
            p.changes_sent.store(10 + 2 * i + 1, Ordering::SeqCst);
            p.synced.store(10 + 2 * i, Ordering::SeqCst);
            p.note_loss();
        }
        assert!(p.may_have_lost((10, 11)) && p.may_have_lost((88, 89)));
        // A merged window is never taken back.
        p.settle(true);
        assert!(p.may_have_lost((10, 11)));
        // The server says it lost nothing since it was last asked: one loss
        // since is taken back; two are not.
        p.changes_sent.store(200, Ordering::SeqCst);
        p.synced.store(190, Ordering::SeqCst);
        p.note_loss();
        assert!(p.unsettled() && p.may_have_lost((195, 196)));
        p.settle(true);
        assert!(!p.unsettled() && !p.may_have_lost((195, 196)));
        p.note_loss();
        p.note_loss();
        p.settle(true);
        assert!(p.may_have_lost((195, 196)), "two losses since the server was asked");
        // Asked after a crash: stays, and settled.
        p.changes_sent.store(300, Ordering::SeqCst);
        p.note_loss();
        p.settle(false);
        assert!(!p.unsettled() && p.may_have_lost((250, 251)));
    }

    /// Answers every request at once, but a write only once `gate` lets it;
    /// its incarnation is `incarnation` (0: it does not say).
    struct Server {
        gate: Arc<Semaphore>,
        incarnation: (u64, Option<u64>),
    }

    impl Handler for Server {
        async fn handle(&self, req: Request, _data: Bytes) -> (Response, Bytes) {
            if let (Request::Incarnation, (now, after)) = (&req, self.incarnation) {
                if now != 0 {
                    let r = Response::Incarnation {
                        now,
                        after_graceful_stop_of: after,
                    };
                    return (r, Bytes::new());
                }
            }
            if let Request::WriteBuffered { .. } = req {
                self.gate.acquire().await.expect("open").forget();
                return (Response::Written { len: 0 }, Bytes::new());
            }
            (Response::Ok, Bytes::new())
        }
    }

    fn write() -> Request {
        Request::WriteBuffered { handle: 1, offset: 0 }
    }

    /// A sync is due after a change and not after a read or another sync;
    /// a sync sent while a change was in flight covers nothing, since the
    /// change may reach the server after it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sync_is_due_only_after_a_change_it_has_not_covered() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let secret = Secret::generate();
        let gate = Arc::new(Semaphore::new(0));
        let (_stop, rx) = tokio::sync::watch::channel(false);
        let server = Server {
            gate: gate.clone(),
            incarnation: (0, None),
        };
        tokio::spawn(serve(l, secret.clone(), Arc::new(server), rx));
        let p = Arc::new(Peer::new("data server 0".into(), addr, secret));
        assert!(p.sync_due().is_none(), "nothing sent yet");
        let read = Request::Read {
            handle: 1,
            offset: 0,
            len: 1,
            need: 0,
        };
        p.call(&read, &[]).await.unwrap();
        assert!(p.sync_due().is_none(), "a read changes nothing");

        gate.add_permits(1);
        p.call(&write(), b"x").await.unwrap();
        let due = p.sync_due().expect("a change to sync");
        p.call(&Request::Sync, &[]).await.unwrap();
        p.synced(due);
        assert!(p.sync_due().is_none(), "the sync covered the change");

        // A change in flight while the sync is sent: the sync covers the
        // change answered before it, not the one in flight.
        gate.add_permits(1);
        p.call(&write(), b"a").await.unwrap();
        let answered = p.changes().0;
        let w = tokio::spawn({
            let p = p.clone();
            async move { p.call(&write(), b"y").await.unwrap() }
        });
        while p.changes().0 == p.changes().1 {
            tokio::task::yield_now().await;
        }
        let due = p.sync_due().expect("a change in flight");
        p.call(&Request::Sync, &[]).await.unwrap();
        p.synced(due);
        assert_eq!(
            p.synced.load(Ordering::SeqCst),
            answered,
            "the answered change is covered"
        );
        gate.add_permits(1);
        w.await.unwrap();
        let due = p.sync_due().expect("the change in flight is not covered");
        p.call(&Request::Sync, &[]).await.unwrap();
        p.synced(due);
        assert!(p.sync_due().is_none());

        // A change made durably covers itself and what came before it.
        gate.add_permits(1);
        p.call(&write(), b"z").await.unwrap();
        let mark = p.sync_mark();
        let durably = Request::Durably { req: Box::new(write()) };
        p.call(&durably, &[]).await.unwrap();
        p.synced_with_own(mark);
        assert!(p.sync_due().is_none(), "the durable change covered both");
    }

    /// Each reconnection asks the server's incarnation and judges the loss
    /// before it: a graceful restart (the next incarnation says the one
    /// before lost nothing) takes it back; a crash of the machine (it does
    /// not say so) leaves the changes since the last sync unsure.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reconnection_judges_the_loss_by_the_server_incarnation() {
        let secret = Secret::generate();
        let gate = Arc::new(Semaphore::new(100));
        let mut addr = "127.0.0.1:0".to_string();
        // Serves as incarnation `now` at `addr`, until the sender is dropped.
        let start = |addr: &str, now: u64, after: Option<u64>| {
            let (secret, gate, addr) = (secret.clone(), gate.clone(), addr.to_string());
            async move {
                let l = tokio::net::TcpListener::bind(&addr).await.unwrap();
                let at = l.local_addr().unwrap().to_string();
                let (stop, rx) = tokio::sync::watch::channel(false);
                let server = Server {
                    gate,
                    incarnation: (now, after),
                };
                let served = tokio::spawn(serve(l, secret, Arc::new(server), rx));
                (at, stop, served)
            }
        };
        let read = Request::Read {
            handle: 1,
            offset: 0,
            len: 1,
            need: 0,
        };
        let (at, stop, served) = start(&addr, 1, None).await;
        addr = at;
        let p = Peer::new("data server 0".into(), addr.clone(), secret.clone());
        p.call(&write(), b"a").await.unwrap();
        let first = (0, p.change_count());
        // Stops the server, then serves as incarnation `now` at `addr`.
        let restart = |stop: tokio::sync::watch::Sender<bool>, served: tokio::task::JoinHandle<()>, now, after| {
            let start = &start;
            let addr = addr.clone();
            async move {
                stop.send(true).unwrap();
                served.await.unwrap();
                let (_, stop, served) = start(&addr, now, after).await;
                (stop, served)
            }
        };
        // A graceful restart: the next incarnation kept everything.
        let (stop, served) = restart(stop, served, 2, Some(1)).await;
        p.call(&read, &[]).await.unwrap();
        assert!(!p.may_have_lost(first), "a graceful restart lost nothing");
        let due = p.sync_due().expect("the write is not covered by a sync");
        p.call(&Request::Sync, &[]).await.unwrap();
        p.synced(due);
        // A crash of the machine: the one before is not said to be kept.
        p.call(&write(), b"b").await.unwrap();
        let second = (first.1, p.change_count());
        let (stop, served) = restart(stop, served, 3, None).await;
        p.call(&read, &[]).await.unwrap();
        assert!(
            p.may_have_lost(second),
            "a crash of the machine may have lost the write"
        );
        assert!(!p.may_have_lost(first), "the first write was judged before");
        assert!(!p.unsettled());
        // The network dropped, the server stayed: the same incarnation.
        p.call(&write(), b"c").await.unwrap();
        let third = (second.1, p.change_count());
        let (_stop, _served) = restart(stop, served, 3, None).await;
        p.call(&read, &[]).await.unwrap();
        assert!(!p.may_have_lost(third), "the same incarnation lost nothing");
        assert!(p.may_have_lost(second), "the crash's loss stays");
    }
}
