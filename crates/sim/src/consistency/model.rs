//! The consistency model: several simulated nodes and one server (metadata
//! and data together) exchanging the consistency plug-ins' messages over a
//! modelled network. Each node runs the same plug-in code as the real node
//! client (`parcache_core::consistency`), and the server runs the same
//! `sprite` server half as the metadata server. Nodes run random sessions
//! (open, reads and writes of a few blocks, close) on one shared file; the
//! history goes to the checker ([`super::history`]).
//!
//! The node cache is modelled as delayed write-back without eviction (the
//! hardest case for consistency: dirty blocks stay until a plug-in pushes
//! them); the network as a fixed one-way latency.

use super::history::{OpKind, Rec};
use crate::kernel::Kernel;
use crate::rng::SimRng;
use parcache_core::consistency::sprite::SpriteServer;
use parcache_core::consistency::{Action, Callback, Consistency, ConsistencyKind, NodeFile, ServerView};
use parcache_core::{Span, Time};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// The one shared file.
const FILE: u64 = 1;
/// Bytes per block (only sizes depend on it).
const BLOCK: u64 = 4096;

/// What a run looks like.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub nodes: usize,
    pub blocks: u64,
    /// Sessions each node runs.
    pub sessions: usize,
    /// Reads and writes per session, at most.
    pub ops_per_session: u64,
    /// The share of reads and writes that are writes.
    pub write_fraction: f64,
    /// One-way network latency.
    pub latency: Span,
    /// Mean pause between a node's operations.
    pub think: Span,
    pub seed: u64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            nodes: 3,
            blocks: 4,
            sessions: 40,
            ops_per_session: 5,
            write_fraction: 0.4,
            latency: Span::from_millis_f64(0.1),
            think: Span::from_millis(1),
            seed: 1,
        }
    }
}

/// What a run produced.
#[derive(Debug, Default)]
pub struct Outcome {
    pub history: Vec<Rec>,
    /// Each value's place in the order the server applied writes.
    pub applied: HashMap<u64, u64>,
    /// Messages sent (both ways, callbacks included).
    pub messages: u64,
    /// Virtual time the run took.
    pub elapsed: Span,
}

#[derive(Clone, Debug)]
enum Msg {
    GetAttr,
    Open {
        write: bool,
    },
    Close {
        write: bool,
    },
    Push(Vec<(u64, u64)>),
    Report {
        size: u64,
    },
    /// A block; `hold`: the node will cache it (`sync-write`'s directory
    /// learns that with the read, before any later write).
    Read(u64, bool),
    Write(u64, u64),
    ReadAll,
    /// `sync-write`: the node wrote these blocks through; answered once
    /// every other node caching one dropped it.
    SyncWritten(u64, u64),
    /// A callback done: what it pushed, and a size report if one was due.
    CalledBack {
        id: u64,
        pushed: Vec<(u64, u64)>,
        report: Option<(u64, u64)>,
    },
}

#[derive(Clone, Debug)]
enum Reply {
    View(ServerView),
    Opened(ServerView, bool),
    Ok,
    Value(u64),
    All(Vec<(u64, u64)>),
}

enum Ev {
    /// A node goes on with its script.
    Step(usize),
    Arrive(usize, Msg),
    Answer(usize, Reply),
    CallbackAt(usize, u64, Callback),
    /// A callback's size report was answered.
    CallbackReported(usize, u64, ServerView),
}

/// One step of a node's current operation.
#[derive(Clone, Copy, Debug)]
enum Step {
    PreOpen(bool),
    PostOpen,
    PreRead,
    Read(u64),
    Write(u64),
    PostWrite(bool),
    Flush,
    Release(bool),
    Finish,
}

/// What a node waits for.
#[derive(Clone, Copy, Debug)]
enum Waiting {
    Attr { revalidate: bool },
    Opened,
    Done,
    Reported { upto: u64 },
    Value { block: u64, cache: bool },
    Written { block: u64 },
    All,
}

struct Node {
    plugin: Box<dyn Consistency>,
    file: NodeFile,
    cache: HashMap<u64, u64>,
    dirty: BTreeMap<u64, u64>,
    latest: ServerView,
    cacheable: bool,
    steps: VecDeque<Step>,
    acts: VecDeque<Action>,
    waiting: Option<Waiting>,
    /// The operation in progress: its record, completed at `Finish`.
    op: Option<Rec>,
    session: u64,
    sessions_left: usize,
    rng: SimRng,
}

struct Server {
    blocks: HashMap<u64, u64>,
    size: u64,
    version: u64,
    next_seq: u64,
    applied: HashMap<u64, u64>,
    sprite: SpriteServer,
    /// Opens (true) and sync-writes (false) waiting for callbacks: node,
    /// callbacks, which.
    pending: Vec<(usize, Vec<u64>, bool)>,
}

impl Server {
    fn apply(&mut self, block: u64, value: u64) {
        self.blocks.insert(block, value);
        self.next_seq += 1;
        self.applied.insert(value, self.next_seq);
    }
    fn view(&self) -> ServerView {
        ServerView {
            size: self.size,
            version: self.version,
        }
    }
    fn report(&mut self, size: u64) -> ServerView {
        self.size = self.size.max(size);
        self.version += 1;
        self.view()
    }
}

/// Runs one model of `kind` with `p`.
pub fn run(kind: ConsistencyKind, p: &Params) -> Outcome {
    Model::new(kind, p).run()
}

struct Model {
    p: Params,
    k: Kernel<Ev>,
    nodes: Vec<Node>,
    server: Server,
    out: Outcome,
    next_value: u64,
    next_session: u64,
}

impl Model {
    fn new(kind: ConsistencyKind, p: &Params) -> Self {
        let view = ServerView { size: 0, version: 1 };
        let mut sprite = SpriteServer::new();
        let nodes = (0..p.nodes)
            .map(|i| {
                // Every node listens for callbacks from the start.
                sprite.poll(Time::ZERO, i as u64);
                Node {
                    plugin: kind.build(),
                    file: NodeFile::new(view, Time::ZERO),
                    cache: HashMap::new(),
                    dirty: BTreeMap::new(),
                    latest: view,
                    cacheable: true,
                    steps: VecDeque::new(),
                    acts: VecDeque::new(),
                    waiting: None,
                    op: None,
                    session: 0,
                    sessions_left: p.sessions,
                    rng: SimRng::stream(p.seed, i as u64),
                }
            })
            .collect();
        Model {
            p: *p,
            k: Kernel::new(),
            nodes,
            server: Server {
                blocks: HashMap::new(),
                size: 0,
                version: 1,
                next_seq: 0,
                applied: HashMap::new(),
                sprite,
                pending: Vec::new(),
            },
            out: Outcome::default(),
            next_value: 1,
            next_session: 1,
        }
    }

    fn run(mut self) -> Outcome {
        for i in 0..self.nodes.len() {
            self.k.at(Time::ZERO, Ev::Step(i));
        }
        while let Some((_, ev)) = self.k.pop() {
            match ev {
                Ev::Step(n) => self.step(n),
                Ev::Arrive(n, m) => self.serve(n, m),
                Ev::Answer(n, r) => self.answered(n, r),
                Ev::CallbackAt(n, id, cb) => self.called_back(n, id, cb),
                Ev::CallbackReported(n, upto, v) => {
                    self.nodes[n].file.reported(upto, v);
                    self.nodes[n].latest = v;
                }
            }
        }
        self.out.applied = std::mem::take(&mut self.server.applied);
        self.out.elapsed = self.k.now().since(Time::ZERO);
        self.out
    }

    fn send(&mut self, n: usize, m: Msg) {
        self.out.messages += 1;
        self.k.after(self.p.latency, Ev::Arrive(n, m));
    }

    fn reply(&mut self, n: usize, r: Reply) {
        self.out.messages += 1;
        self.k.after(self.p.latency, Ev::Answer(n, r));
    }

    /// The node goes on: the next action, else the next step, else the
    /// next operation after a pause.
    fn step(&mut self, n: usize) {
        loop {
            if self.nodes[n].waiting.is_some() {
                return;
            }
            if let Some(a) = self.nodes[n].acts.pop_front() {
                self.act(n, a);
                continue;
            }
            let Some(s) = self.nodes[n].steps.pop_front() else {
                if self.begin_op(n) {
                    continue;
                }
                return;
            };
            self.do_step(n, s);
        }
    }

    /// Starts the node's next operation after a pause, if it has one.
    /// Returns whether it started one now.
    fn begin_op(&mut self, n: usize) -> bool {
        let now = self.k.now();
        let node = &mut self.nodes[n];
        if node.op.is_some() {
            return false;
        }
        if node.sessions_left == 0 && node.session == 0 {
            return false;
        }
        if node.session == 0 {
            // A new session after a pause.
            let pause = Span(
                (node
                    .rng
                    .exp_truncated(self.p.think.0 as f64, 10.0 * self.p.think.0 as f64)) as u64,
            );
            node.sessions_left -= 1;
            node.session = self.next_session;
            self.next_session += 1;
            let write = node.rng.uniform() < 0.6;
            let ops = 1 + node.rng.below(self.p.ops_per_session);
            node.steps.extend([Step::PreOpen(write), Step::PostOpen, Step::Finish]);
            for _ in 0..ops {
                let b = node.rng.below(self.p.blocks);
                if write && node.rng.uniform() < self.p.write_fraction * 2.0 {
                    node.steps.extend([Step::Write(b), Step::Finish]);
                } else {
                    node.steps.extend([Step::PreRead, Step::Read(b), Step::Finish]);
                }
            }
            node.steps.extend([Step::Flush, Step::Release(write), Step::Finish]);
            node.waiting = Some(Waiting::Done);
            node.op = Some(Rec {
                node: n,
                kind: OpKind::Open { write },
                block: 0,
                value: 0,
                start: now + pause,
                end: now + pause,
                session: node.session,
            });
            self.k.after(pause, Ev::Answer(n, Reply::Ok));
            // The pause counts as no message.
            return false;
        }
        false
    }

    fn do_step(&mut self, n: usize, s: Step) {
        let now = self.k.now();
        let node = &mut self.nodes[n];
        let start = |node: &mut Node, kind: OpKind, block: u64| {
            node.op = Some(Rec {
                node: n,
                kind,
                block,
                value: 0,
                start: now,
                end: now,
                session: node.session,
            })
        };
        match s {
            Step::PreOpen(write) => {
                node.cacheable = true;
                let acts = node.plugin.pre_open(&node.file, now, write);
                for a in acts {
                    match a {
                        Action::FetchAttr => {
                            node.waiting = Some(Waiting::Attr { revalidate: false });
                            self.send(n, Msg::GetAttr);
                            return;
                        }
                        Action::OpenAtServer { write } => {
                            node.waiting = Some(Waiting::Opened);
                            self.send(n, Msg::Open { write });
                            return;
                        }
                        other => node.acts.push_back(other),
                    }
                }
            }
            Step::PostOpen => {
                let (latest, cacheable) = (node.latest, node.cacheable);
                let acts = node.plugin.post_open(&mut node.file, now, latest, cacheable);
                node.acts.extend(acts);
            }
            Step::PreRead => {
                start(node, OpKind::Read, 0);
                let acts = node.plugin.pre_read(&node.file, now);
                node.acts.extend(acts);
            }
            Step::Read(b) => {
                if let Some(op) = node.op.as_mut() {
                    op.block = b;
                }
                if node.file.cached {
                    if let Some(&v) = node.dirty.get(&b).or_else(|| node.cache.get(&b)) {
                        node.op.as_mut().expect("a read").value = v;
                        return;
                    }
                }
                let cache = node.file.cached;
                let hold = cache && node.plugin.tracks_blocks();
                node.waiting = Some(Waiting::Value { block: b, cache });
                self.send(n, Msg::Read(b, hold));
            }
            Step::Write(b) => {
                start(node, OpKind::Write, b);
                let v = self.next_value;
                self.next_value += 1;
                let node = &mut self.nodes[n];
                node.op.as_mut().expect("a write").value = v;
                let end = (b + 1) * BLOCK;
                let grew = end > node.file.size;
                node.file.written_blocks = Some((b, b));
                if node.file.cached {
                    node.dirty.insert(b, v);
                    node.cache.insert(b, v);
                    node.file.wrote(end);
                    node.steps.push_front(Step::PostWrite(grew));
                } else {
                    node.waiting = Some(Waiting::Written { block: b });
                    node.steps.push_front(Step::PostWrite(grew));
                    self.send(n, Msg::Write(b, v));
                }
            }
            Step::PostWrite(grew) => {
                let acts = node.plugin.post_write(&mut node.file, now, grew);
                node.acts.extend(acts);
            }
            Step::Flush => {
                start(node, OpKind::Close, 0);
                let acts = node.plugin.flush(&mut node.file, now);
                node.acts.extend(acts);
            }
            Step::Release(write) => {
                let acts = node.plugin.release(&mut node.file, now, write);
                node.acts.extend(acts);
            }
            Step::Finish => {
                if let Some(mut op) = node.op.take() {
                    op.end = now;
                    let closed = op.kind == OpKind::Close;
                    self.out.history.push(op);
                    if closed {
                        self.nodes[n].session = 0;
                    }
                }
            }
        }
    }

    /// Carries out one of a plug-in's actions.
    fn act(&mut self, n: usize, a: Action) {
        let now = self.k.now();
        let node = &mut self.nodes[n];
        match a {
            Action::FetchAttr => {
                node.waiting = Some(Waiting::Attr { revalidate: true });
                self.send(n, Msg::GetAttr);
            }
            // Only an open asks it (handled in `PreOpen`).
            Action::OpenAtServer { .. } => {}
            Action::CloseAtServer { write } => {
                node.waiting = Some(Waiting::Done);
                self.send(n, Msg::Close { write });
            }
            Action::PushDirty => {
                if node.dirty.is_empty() {
                    return;
                }
                let pushed: Vec<(u64, u64)> = std::mem::take(&mut node.dirty).into_iter().collect();
                node.waiting = Some(Waiting::Done);
                self.send(n, Msg::Push(pushed));
            }
            Action::ReportSize => {
                if !node.file.unreported() {
                    return;
                }
                let (upto, size) = (node.file.writes, node.file.size);
                node.waiting = Some(Waiting::Reported { upto });
                self.send(n, Msg::Report { size });
            }
            Action::DropCached => {
                node.cache.clear();
                // As the real pool's discard: unpushed bytes go too (a
                // plug-in pushes first; the checker catches one that does not).
                node.dirty.clear();
            }
            Action::Adopt => {
                let latest = node.latest;
                node.file.adopt(latest, now);
            }
            Action::FetchWhole => {
                node.waiting = Some(Waiting::All);
                self.send(n, Msg::ReadAll);
            }
            // No chunk hashes in this model (block store only).
            Action::DropHashes | Action::CommitDelayed => {}
            Action::InvalidateOthers { first, last } => {
                node.waiting = Some(Waiting::Done);
                self.send(n, Msg::SyncWritten(first, last));
            }
            Action::DropBlocks { first, last } => drop_clean(node, first, last),
        }
    }

    /// A node's message reaches the server.
    fn serve(&mut self, n: usize, m: Msg) {
        let now = self.k.now();
        let s = &mut self.server;
        match m {
            Msg::GetAttr => {
                let v = s.view();
                self.reply(n, Reply::View(v));
            }
            Msg::Open { write } => {
                let o = s.sprite.open_at(now, n as u64, FILE, write);
                self.deliver(now, &o.notify);
                if o.wait.is_empty() {
                    let v = self.server.view();
                    let c = self.server.sprite.may_cache(FILE);
                    self.reply(n, Reply::Opened(v, c));
                } else {
                    self.server.pending.push((n, o.wait, true));
                }
            }
            Msg::SyncWritten(first, last) => {
                let o = s.sprite.sync_written_at(now, n as u64, FILE, first, last);
                self.deliver(now, &o.notify);
                if o.wait.is_empty() {
                    self.reply(n, Reply::Ok);
                } else {
                    self.server.pending.push((n, o.wait, false));
                }
            }
            Msg::Close { write } => {
                s.sprite.close(n as u64, FILE, write);
                self.reply(n, Reply::Ok);
            }
            Msg::Push(blocks) => {
                for (b, v) in blocks {
                    s.apply(b, v);
                }
                self.reply(n, Reply::Ok);
            }
            Msg::Report { size } => {
                let v = s.report(size);
                self.reply(n, Reply::View(v));
            }
            Msg::Read(b, hold) => {
                if hold {
                    s.sprite.hold_blocks(now, n as u64, FILE, b, b);
                }
                let v = s.blocks.get(&b).copied().unwrap_or(0);
                self.reply(n, Reply::Value(v));
            }
            Msg::Write(b, v) => {
                s.apply(b, v);
                self.reply(n, Reply::Ok);
            }
            Msg::ReadAll => {
                let all = s.blocks.iter().map(|(&b, &v)| (b, v)).collect();
                self.reply(n, Reply::All(all));
            }
            Msg::CalledBack { id, pushed, report } => {
                for (b, v) in pushed {
                    s.apply(b, v);
                }
                if let Some((upto, size)) = report {
                    let v = s.report(size);
                    self.out.messages += 1;
                    self.k.after(self.p.latency, Ev::CallbackReported(n, upto, v));
                }
                self.server.sprite.answered(n as u64, id);
                let ready: Vec<(usize, bool)> = {
                    let sp = &self.server.sprite;
                    let (done, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut self.server.pending)
                        .into_iter()
                        .partition(|(_, ids, _)| !sp.waiting(ids));
                    self.server.pending = wait;
                    done.into_iter().map(|(o, _, open)| (o, open)).collect()
                };
                for (o, open) in ready {
                    if open {
                        let v = self.server.view();
                        let c = self.server.sprite.may_cache(FILE);
                        self.reply(o, Reply::Opened(v, c));
                    } else {
                        self.reply(o, Reply::Ok);
                    }
                }
            }
        }
    }

    /// Sends the callbacks queued for each of `to` (each node keeps a poll
    /// outstanding).
    fn deliver(&mut self, now: Time, to: &[u64]) {
        for &to in to {
            let q = self.server.sprite.poll_ended(now, to);
            self.server.sprite.poll(now, to);
            for c in q {
                self.out.messages += 1;
                self.k.after(self.p.latency, Ev::CallbackAt(to as usize, c.id, c.cb));
            }
        }
    }

    /// The server's answer reaches the node.
    fn answered(&mut self, n: usize, r: Reply) {
        let now = self.k.now();
        let node = &mut self.nodes[n];
        let w = node.waiting.take();
        match (w, r) {
            (Some(Waiting::Attr { revalidate }), Reply::View(v)) => {
                node.latest = v;
                if revalidate {
                    let more = node.plugin.revalidated(&mut node.file, now, v);
                    for a in more.into_iter().rev() {
                        node.acts.push_front(a);
                    }
                }
            }
            (Some(Waiting::Opened), Reply::Opened(v, c)) => {
                node.latest = v;
                node.cacheable = c;
            }
            (Some(Waiting::Reported { upto }), Reply::View(v)) => {
                node.file.reported(upto, v);
                node.latest = v;
            }
            (Some(Waiting::Value { block, cache }), Reply::Value(v)) => {
                if cache && node.file.cached {
                    node.cache.insert(block, v);
                }
                if let Some(op) = node.op.as_mut() {
                    op.value = v;
                }
            }
            (Some(Waiting::Written { block }), Reply::Ok) => {
                node.file.wrote((block + 1) * BLOCK);
            }
            (Some(Waiting::All), Reply::All(all)) => {
                for (b, v) in all {
                    if !node.dirty.contains_key(&b) {
                        node.cache.insert(b, v);
                    }
                }
            }
            (Some(Waiting::Done), Reply::Ok) => {}
            (w, r) => panic!("node {n} waiting for {w:?} got {r:?}"),
        }
        self.step(n);
    }

    /// A callback reaches a node: it does what the plug-in says at once
    /// (as the real node holds the file alone for it) and answers.
    fn called_back(&mut self, n: usize, id: u64, cb: Callback) {
        let node = &mut self.nodes[n];
        let acts = node.plugin.called_back(&mut node.file, cb);
        let mut pushed = Vec::new();
        let mut report = None;
        for a in acts {
            match a {
                Action::PushDirty => pushed.extend(std::mem::take(&mut node.dirty)),
                Action::DropCached => {
                    node.cache.clear();
                    node.dirty.clear();
                }
                Action::ReportSize if node.file.unreported() => report = Some((node.file.writes, node.file.size)),
                Action::DropBlocks { first, last } => drop_clean(node, first, last),
                _ => {}
            }
        }
        self.send(n, Msg::CalledBack { id, pushed, report });
    }
}

/// Drops a node's clean cached copies of blocks `first..=last` (a dirty
/// one holds newer bytes of its own).
fn drop_clean(node: &mut Node, first: u64, last: u64) {
    let dirty = &node.dirty;
    node.cache
        .retain(|b, _| !(first..=last).contains(b) || dirty.contains_key(b));
}

#[cfg(test)]
mod tests {
    use super::super::history::{check, promises, Promise};
    use super::*;

    #[test]
    fn same_seed_same_history() {
        let p = Params::default();
        for kind in ConsistencyKind::ALL {
            let a = run(kind, &p);
            let b = run(kind, &p);
            assert_eq!(a.history.len(), b.history.len(), "{kind}");
            assert_eq!(a.messages, b.messages, "{kind}");
            assert_eq!(a.elapsed, b.elapsed, "{kind}");
            assert!(a.history.len() > 100, "{kind}: {} operations", a.history.len());
        }
    }

    /// Every plug-in keeps its promise over many seeds, and the checker
    /// has teeth: the weaker plug-ins break the stronger promises. (Before
    /// `SpriteServer::may_cache`, sprite broke both: an open answered
    /// "cacheable" after another open had made the file write-shared.)
    #[test]
    fn every_plug_in_keeps_its_promise() {
        let mut broken = HashMap::new();
        for kind in ConsistencyKind::ALL {
            for seed in 0..20 {
                let o = run(
                    kind,
                    &Params {
                        seed,
                        ..Params::default()
                    },
                );
                for p in Promise::ALL {
                    let bad = check(&o.history, &o.applied, p);
                    if promises(kind).contains(&p) {
                        assert!(bad.is_empty(), "{kind}, seed {seed}, {}: {}", p.name(), bad[0]);
                    }
                    *broken.entry((kind.name(), p)).or_insert(0) += bad.len();
                }
            }
        }
        assert!(broken[&("none", Promise::CloseToOpen)] > 0);
        assert!(broken[&("close-to-open", Promise::ReadAfterWrite)] > 0);
        assert!(broken[&("session", Promise::ReadAfterWrite)] > 0);
    }
}
